"""Benchmark the top-k KL: fused Triton kernel vs chunked torch vs a NeMo-RL-style baseline.

    # the real run (one GPU): V = 151936, k in {64, 128}, N in {4096, 16384, 65536}, bf16
    uv run --extra gpu python benchmarks/bench_topk_kl.py --json topk_kl.json
    # a smoke run on a CPU (tiny shapes; the kernel in Triton's interpreter)
    TRITON_INTERPRET=1 uv run --extra cpu python benchmarks/bench_topk_kl.py --device cpu --quick

Candidates (same divergence, same inputs, forward + backward w.r.t. the logits):
  triton   nemo_opd.losses.topk_kl(implementation="triton"): two streaming passes over the
           vocab in forward (the gradient is written there), backward scales it.
  torch    the same algorithm in plain torch, in chunks of rows.
  nemo_rl  the usual approach: upcast the logits to fp32, full log_softmax, gather at the
           teacher's ids, the bucket tail from a masked logsumexp, the divergence over the
           buckets (nemo_opd.losses.topk_divergence, shared with the package), autograd.

For the fused kernel the achieved HBM bandwidth is reported as 6 * N * V bytes (bf16 logits
read twice, the bf16 gradient written once) over the forward time, against the device's peak
(--peak-gbps, or a small table by device name).
"""

import argparse
import math
import sys

import torch
from harness import Measurement, device_name, format_table, measure, write_json

from nemo_opd.losses import TopkKLParams, topk_divergence, topk_kl

PEAK_GBPS = {"H200": 4800.0, "H100 PCIe": 2000.0, "H100 NVL": 3900.0, "H100": 3350.0}
"""Peak HBM bandwidth in GB/s by device-name fragment, most specific first (SXM for H100)."""

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def nemo_rl_style(logits, logprobs, ids, params: TopkKLParams) -> torch.Tensor:
    """Full fp32 log_softmax over the vocabulary, then the bucket divergence. [N]"""
    log_q = torch.log_softmax(logits.float() / params.temperature, dim=-1)
    log_q_topk = log_q.gather(-1, ids)
    if params.tail == "bucket":
        log_q_tail = log_q.scatter(-1, ids, -math.inf).logsumexp(dim=-1)
        return topk_divergence(log_q_topk, log_q_tail, logprobs, params).divergence
    return topk_divergence(log_q_topk, None, logprobs, params).divergence


def make_case(n, vocab, k, dtype, device, seed=0):
    gen = torch.Generator(device=device).manual_seed(seed)
    logits = torch.randn(n, vocab, generator=gen, device=device, dtype=torch.float32) * 2
    logits = logits.to(dtype)
    teacher = torch.randn(n, vocab, generator=gen, device=device) * 2
    top = torch.log_softmax(teacher, dim=-1).topk(k, dim=-1)
    del teacher
    return logits, top.values, top.indices


def candidates(params: TopkKLParams, names):
    def functional(implementation):
        return lambda x: topk_kl(x[0], x[1], x[2], params=params, implementation=implementation)

    table = {
        "triton": functional("triton"),
        "torch": functional("torch"),
        "nemo_rl": lambda x: nemo_rl_style(x[0], x[1], x[2], params),
    }
    return {name: table[name] for name in names}


def bandwidth_columns(row: Measurement, n: int, vocab: int, itemsize: int, peak_gbps):
    """Achieved bandwidth of the fused kernel: 3 * itemsize * N * V bytes over forward."""
    if row.name != "triton" or row.forward_ms is None:
        return
    gbps = 3 * itemsize * n * vocab / (row.forward_ms * 1e-3) / 1e9
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
    parser.add_argument("--kl-type", default="reverse")
    parser.add_argument("--tail", default="bucket")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--impls", nargs="+", default=["triton", "torch", "nemo_rl"])
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--peak-gbps", type=float, default=None)
    parser.add_argument("--json", default=None, help="write the results here")
    args = parser.parse_args(argv)
    if args.quick:
        args.vocab, args.k, args.n = 509, [8], [4, 16]
        args.warmup, args.iters = 1, 2
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: run with --device cpu --quick for a smoke run", file=sys.stderr)
        return 2
    name = device_name(device)
    peak = args.peak_gbps or next((v for k, v in PEAK_GBPS.items() if k in name), None)
    params = TopkKLParams(args.kl_type, 0.5, 0.5, args.tail, args.temperature)
    dtype = DTYPES[args.dtype]
    names = list(args.impls)
    if device.type != "cuda" and "triton" in names:
        from nemo_opd.ops.topk_kl_triton import kernels_interpreted

        if not kernels_interpreted():
            print("skipping triton: on a CPU it needs TRITON_INTERPRET=1", file=sys.stderr)
            names.remove("triton")
    impls = candidates(params, names)

    rows = []
    for n in args.n:
        for k in args.k:
            logits, logprobs, ids = make_case(n, args.vocab, k, dtype, device)
            case = {"N": n, "V": args.vocab, "k": k}

            def make_inputs(logits=logits, logprobs=logprobs, ids=ids):
                return logits.detach().clone().requires_grad_(), logprobs, ids

            def backward(inputs, div):
                div.backward(torch.ones_like(div))

            for impl, forward in impls.items():
                row = measure(
                    impl, case, make_inputs, forward, backward,
                    device=device, warmup=args.warmup, iters=args.iters,
                )  # fmt: skip
                if device.type == "cuda":
                    bandwidth_columns(row, n, args.vocab, logits.element_size(), peak)
                rows.append(row)
            del logits, logprobs, ids

    print(f"# top-k KL ({params.kl_type}, tail={params.tail}, {args.dtype} logits) on {name}")
    print(format_table(rows, extra_columns=["fwd GB/s", "% of HBM peak"]))
    if args.json:
        meta = {"device": name, "peak_gbps": peak, "args": vars(args)}
        write_json(args.json, rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
