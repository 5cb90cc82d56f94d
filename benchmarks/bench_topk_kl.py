"""Benchmark the top-k KL: our fused Triton kernel and its torch twin against a re-implementation
of NeMo-RL's default distillation loss.

    # the real run (one GPU): V = 151936, k in {64, 128}, N in {4096, 16384, 65536}, bf16
    uv run --extra gpu python benchmarks/bench_topk_kl.py --json topk_kl.json
    # a smoke run on a CPU (tiny shapes; the kernel in Triton's interpreter)
    TRITON_INTERPRET=1 uv run --extra cpu python benchmarks/bench_topk_kl.py --device cpu --quick

Each candidate computes the divergence and its gradient w.r.t. the logits, on two paths:
  training   sum(weights * divergence) and a scalar backward, what DistillationLossFn runs
             (ours: topk_kl_weighted_sum, which folds the weights into the gradient in forward
             and, in the Triton kernel, skips the backward pass when the scalar is 1);
  per_token  the divergence per position [N], backward with a gradient of ones (ours: topk_kl).

Candidates:
  triton          nemo_opd.losses with implementation="triton", the fused kernel.
  torch           nemo_opd.losses with implementation="torch", the same algorithm in chunks.
  nemo_rl_reimpl  NeMo-RL's default loss (loss_fn.zero_outside_topk=False) re-implemented here:
                  the whole logits cast to fp32, gathered at the teacher's ids, log_softmax over
                  those k ids (the student renormalized over the top-k, no tail), the teacher's
                  top-k renormalized likewise, forward / reverse / mixed KL over the k, autograd.
                  It exists only for tail="renormalize" and kl_type forward, reverse or mixed.

Ours run with both tails: "renormalize" computes NeMo-RL's divergence (the like-for-like
comparison), "bucket" our default (reported beside it; it also streams the logits once more).
For the fused kernel the table gives the bytes its vocabulary passes must move over its total
time, and that as a fraction of the traffic bound: those bytes at the device-to-device copy
bandwidth measured in the same run (a large tensor copy, bytes read plus written). The passes
over [N, V] in the logits' dtype: bucket reads the logits twice and writes the gradient once
(6 N V bytes in bf16), renormalize reads once and writes once; the per_token path's backward
reads and writes the gradient once more. --block-v sweeps the kernel's vocabulary block on the
training path (rows "triton bv=B"; the default is the heuristic's choice). --inplace adds the
training path with inplace_grad (rows "triton inplace": the gradient written over the logits,
DistillationLossFn(inplace_grad=True)), whose extra memory is O(N k). --profile prints, for the
first N and k, torch.profiler's table of one training-path call per tail: where the time goes,
kernel by kernel, and the host's share.
"""

import argparse
import dataclasses
import sys
from typing import NamedTuple

import torch
from harness import Measurement, device_name, format_table, measure, write_json

from nemo_opd.losses import KL_TYPES, TAILS, TopkKLParams, topk_kl, topk_kl_weighted_sum

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
IMPLS = ("triton", "torch", "nemo_rl_reimpl")
PATHS = ("training", "per_token")
NEMO_RL_KL_TYPES = ("forward", "reverse", "mixed")


class Inputs(NamedTuple):
    logits: torch.Tensor  # [N, V], requires grad
    teacher_logprobs: torch.Tensor  # [N, k]
    teacher_ids: torch.Tensor  # [N, k]
    weights: torch.Tensor  # [N], the loss mask over the global count of valid positions


def nemo_rl_reimpl(logits, teacher_logprobs, teacher_ids, params: TopkKLParams) -> torch.Tensor:
    """NeMo-RL's default top-k distillation loss per position [N], written for this benchmark
    from NeMo-RL's algorithm (nemo_rl/distributed/model_utils.py,
    get_distillation_topk_logprobs_from_logits, and the DistillationLossFn of
    nemo_rl/algorithms/loss/loss_functions.py, with zero_outside_topk=False).

    NeMo-RL divides its logits by the temperature in place when the temperature is not 1;
    here the division is out of place, since the benchmark's logits are a leaf of autograd.
    """
    if params.kl_type not in NEMO_RL_KL_TYPES:
        raise ValueError(f"NeMo-RL's loss has kl_type {NEMO_RL_KL_TYPES}, not {params.kl_type!r}")
    if params.temperature != 1.0:
        logits = logits / params.temperature
    full_fp32 = logits.float()  # the whole [N, V] in fp32, as NeMo-RL casts it
    log_q = torch.log_softmax(full_fp32.gather(-1, teacher_ids.long()), dim=-1)
    log_p = torch.log_softmax(teacher_logprobs.float(), dim=-1)
    forward_kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    reverse_kl = (log_q.exp() * (log_q - log_p)).sum(-1)
    w = {"forward": 1.0, "reverse": 0.0}.get(params.kl_type, params.mixed_kl_weight)
    return w * forward_kl + (1.0 - w) * reverse_kl


def candidate(impl: str, path: str, params: TopkKLParams):
    """forward(inputs) of one candidate on one path: the [N] divergence or the scalar loss."""
    if impl == "triton inplace":

        def training(x: Inputs) -> torch.Tensor:
            return topk_kl_weighted_sum(
                x.logits, x.teacher_logprobs, x.teacher_ids, x.weights, params=params,
                implementation="triton", inplace_grad=True,
            )[0]  # fmt: skip

        return training
    if impl == "nemo_rl_reimpl":

        def per_token(x: Inputs) -> torch.Tensor:
            return nemo_rl_reimpl(x.logits, x.teacher_logprobs, x.teacher_ids, params)

        def training(x: Inputs) -> torch.Tensor:
            return (per_token(x) * x.weights).sum()  # NeMo-RL's masked sum / global count
    else:

        def per_token(x: Inputs) -> torch.Tensor:
            return topk_kl(
                x.logits, x.teacher_logprobs, x.teacher_ids, params=params, implementation=impl
            )

        def training(x: Inputs) -> torch.Tensor:
            return topk_kl_weighted_sum(
                x.logits, x.teacher_logprobs, x.teacher_ids, x.weights, params=params,
                implementation=impl,
            )[0]  # fmt: skip

    return training if path == "training" else per_token


def backward(inputs: Inputs, out: torch.Tensor) -> None:
    """A scalar loss: loss.backward(); a per-position divergence: a gradient of ones."""
    out.backward(torch.ones_like(out))


def profile_training_path(make_inputs, params: TopkKLParams, device, iters: int = 5) -> str:
    """torch.profiler's table (by device time) of `iters` training-path calls of the fused
    kernel, after a warm-up call."""
    from torch.profiler import ProfilerActivity, profile

    forward = candidate("triton", "training", params)
    backward(inputs := make_inputs(), forward(inputs))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(iters):
            inputs = make_inputs()
            backward(inputs, forward(inputs))
            del inputs
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    return prof.key_averages().table(sort_by=sort, row_limit=14, max_name_column_width=44)


def make_case(n, vocab, k, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, device=device, dtype=torch.float32) * 2
    logits = logits.to(dtype)
    teacher = torch.randn(n, vocab, generator=gen, device=device) * 2
    top = torch.log_softmax(teacher, dim=-1).topk(k, dim=-1)
    del teacher
    weights = torch.full((n,), 1.0 / n, device=device)  # every position valid
    return logits, top.values, top.indices, weights


def vocab_passes(tail: str, path: str) -> int:
    """Passes over [N, V] in the logits' dtype the fused kernel must make (module docstring)."""
    return (3 if tail == "bucket" else 2) + (2 if path == "per_token" else 0)


def bandwidth_columns(row: Measurement, passes: int, itemsize: int, copy_gbps: float | None):
    """The kernel's achieved bandwidth (the bytes its passes must move over its total time) and
    its fraction of the traffic bound at the measured copy bandwidth."""
    if row.total_ms is None:
        return
    n, vocab = row.case["N"], row.case["V"]
    gbps = passes * itemsize * n * vocab / (row.total_ms * 1e-3) / 1e9
    row.extra["GB/s"] = gbps
    if copy_gbps:
        row.extra["% of bound"] = 100.0 * gbps / copy_gbps


def copy_bandwidth_gbps(device: torch.device, gib: float = 2.0, iters: int = 20) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read plus written), CUDA-event median of
    `iters` copies of a `gib` GiB tensor after warm-up."""
    import statistics

    src = torch.empty(int(gib * 2**30) // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        torch.cuda.synchronize(device)
        times.append(start.elapsed_time(end))
    del src, dst
    torch.cuda.empty_cache()
    return 2 * gib * 2**30 / (statistics.median(times) * 1e-3) / 1e9


def block_sweep_candidate(block_v: int, params: TopkKLParams):
    """The fused kernel's training path (weights folded into the gradient in forward, which
    writes the gradient) at a given vocabulary block."""
    from nemo_opd.ops.topk_kl_triton import topk_kl_triton_forward

    def forward(x: Inputs):
        logits = x.logits.detach()
        div, _, grad = topk_kl_triton_forward(
            logits, x.teacher_logprobs, x.teacher_ids, params, row_weights=x.weights,
            block_v=block_v,
        )  # fmt: skip
        return (div * x.weights).sum(), grad

    return forward


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="tiny shapes, few iterations")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--k", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--n", type=int, nargs="+", default=[4096, 16384, 65536])
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--kl-type", default="reverse", choices=KL_TYPES)
    parser.add_argument("--mixed-kl-weight", type=float, default=0.5)
    parser.add_argument("--jsd-beta", type=float, default=0.5)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--tails", nargs="+", default=["renormalize", "bucket"], choices=TAILS)
    parser.add_argument("--paths", nargs="+", default=list(PATHS), choices=PATHS)
    parser.add_argument("--impls", nargs="+", default=list(IMPLS), choices=IMPLS)
    parser.add_argument("--inplace", action="store_true", help="add the inplace_grad path")
    parser.add_argument("--profile", action="store_true", help="profile the training path")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument(
        "--block-v", type=int, nargs="*", default=[],
        help="also time the fused kernel's training path at these vocabulary blocks",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.k, args.n = 509, [8], [4, 16]
        args.warmup, args.iters = 1, 2
    return args


def runnable_impls(args, device: torch.device) -> list[str]:
    """The requested candidates that can run here, with a note on stderr for each left out."""
    names = list(args.impls)
    if device.type != "cuda" and "triton" in names:
        from nemo_opd.ops.topk_kl_triton import kernels_interpreted

        if not kernels_interpreted():
            print("skipping triton: on a CPU it needs TRITON_INTERPRET=1", file=sys.stderr)
            names.remove("triton")
    if "nemo_rl_reimpl" in names and args.kl_type not in NEMO_RL_KL_TYPES:
        print(f"skipping nemo_rl_reimpl: NeMo-RL has no kl_type {args.kl_type!r}", file=sys.stderr)
        names.remove("nemo_rl_reimpl")
    return names


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --quick for a smoke run", file=sys.stderr)
        return 2
    name = device_name(device)
    copy_gbps = copy_bandwidth_gbps(device) if device.type == "cuda" else None
    if copy_gbps:
        print(f"# device-to-device copy: {copy_gbps:.0f} GB/s (read + write)", flush=True)
    base = TopkKLParams(
        kl_type=args.kl_type,
        mixed_kl_weight=args.mixed_kl_weight,
        jsd_beta=args.jsd_beta,
        temperature=args.temperature,
    )
    impls = runnable_impls(args, device)

    rows = []
    for n in args.n:
        for k in args.k:
            logits, logprobs, ids, weights = make_case(n, args.vocab, k, DTYPES[args.dtype], device)

            def make_inputs(logits=logits, logprobs=logprobs, ids=ids, weights=weights):
                return Inputs(logits.detach().clone().requires_grad_(), logprobs, ids, weights)

            for path in args.paths:
                for tail in args.tails:
                    params = dataclasses.replace(base, tail=tail)
                    inplace = ["triton inplace"] if args.inplace and path == "training" else []
                    for impl in impls + (inplace if "triton" in impls else []):
                        if impl == "nemo_rl_reimpl" and tail != "renormalize":
                            continue  # NeMo-RL has no tail bucket
                        case = {"N": n, "V": args.vocab, "k": k, "path": path, "tail": tail}
                        row = measure(
                            impl, case, make_inputs, candidate(impl, path, params), backward,
                            device=device, warmup=args.warmup, iters=args.iters,
                        )  # fmt: skip
                        if device.type == "cuda" and impl.startswith("triton"):
                            passes = vocab_passes(tail, path)
                            bandwidth_columns(row, passes, logits.element_size(), copy_gbps)
                        rows.append(row)
            for tail in args.tails if "triton" in impls else ():
                params = dataclasses.replace(base, tail=tail)
                for block_v in args.block_v:
                    case = {"N": n, "V": args.vocab, "k": k, "path": "training", "tail": tail}
                    row = measure(
                        f"triton bv={block_v}", case, make_inputs,
                        block_sweep_candidate(block_v, params), lambda inputs, out: None,
                        device=device, warmup=args.warmup, iters=args.iters,
                    )  # fmt: skip
                    if device.type == "cuda":
                        passes = vocab_passes(tail, "training")
                        bandwidth_columns(row, passes, logits.element_size(), copy_gbps)
                    rows.append(row)
            if args.profile and (n, k) == (args.n[0], args.k[0]):
                for tail in args.tails if "triton" in impls else ():
                    params = dataclasses.replace(base, tail=tail)
                    print(f"# profile: the fused kernel's training path, N={n} k={k} {tail}")
                    print(profile_training_path(make_inputs, params, device), flush=True)
            del logits, logprobs, ids, weights

    print(f"# top-k KL ({args.kl_type}, {args.dtype} logits) on {name}")
    print(format_table(rows, extra_columns=["GB/s", "% of bound"]))
    if args.json:
        meta = {"device": name, "copy_gbps": copy_gbps, "args": vars(args)}
        write_json(args.json, rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
