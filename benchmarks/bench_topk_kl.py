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
For the fused kernel the table gives the achieved bandwidth of its forward: the bytes its
vocabulary passes move (bucket: the logits read twice and the gradient written once;
renormalize: the logits read once and the gradient written once) over the forward time, against
the device's peak (--peak-gbps, or a small table by device name).
"""

import argparse
import dataclasses
import sys
from typing import NamedTuple

import torch
from harness import Measurement, device_name, format_table, measure, write_json

from nemo_opd.losses import KL_TYPES, TAILS, TopkKLParams, topk_kl, topk_kl_weighted_sum

PEAK_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100 NVL": 3900.0, "H100": 3350.0}
"""Peak HBM bandwidth in GB/s by device-name fragment, most specific first (SXM for H100)."""

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


def make_case(n, vocab, k, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, device=device, dtype=torch.float32) * 2
    logits = logits.to(dtype)
    teacher = torch.randn(n, vocab, generator=gen, device=device) * 2
    top = torch.log_softmax(teacher, dim=-1).topk(k, dim=-1)
    del teacher
    weights = torch.full((n,), 1.0 / n, device=device)  # every position valid
    return logits, top.values, top.indices, weights


def bandwidth_columns(row: Measurement, n: int, vocab: int, itemsize: int, tail: str, peak_gbps):
    """Achieved bandwidth of the fused kernel's forward: its vocabulary passes move
    (3 for bucket, 2 for renormalize) * itemsize * N * V bytes."""
    if row.name != "triton" or row.forward_ms is None:
        return
    passes = 3 if tail == "bucket" else 2
    gbps = passes * itemsize * n * vocab / (row.forward_ms * 1e-3) / 1e9
    row.extra["fwd GB/s"] = gbps
    if peak_gbps:
        row.extra["% of HBM peak"] = 100.0 * gbps / peak_gbps


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
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--peak-gbps", type=float, default=None)
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
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
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
                    for impl in impls:
                        if impl == "nemo_rl_reimpl" and tail != "renormalize":
                            continue  # NeMo-RL has no tail bucket
                        case = {"N": n, "V": args.vocab, "k": k, "path": path, "tail": tail}
                        row = measure(
                            impl, case, make_inputs, candidate(impl, path, params), backward,
                            device=device, warmup=args.warmup, iters=args.iters,
                        )  # fmt: skip
                        if device.type == "cuda":
                            itemsize = logits.element_size()
                            bandwidth_columns(row, n, args.vocab, itemsize, tail, peak)
                        rows.append(row)
            del logits, logprobs, ids, weights

    print(f"# top-k KL ({args.kl_type}, {args.dtype} logits) on {name}")
    print(format_table(rows, extra_columns=["fwd GB/s", "% of HBM peak"]))
    if args.json:
        meta = {"device": name, "peak_gbps": peak, "args": vars(args)}
        write_json(args.json, rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
