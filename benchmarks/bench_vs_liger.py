"""The student's loss path beside Liger-Kernel's, in one run: speed, memory and bf16 gradients.

    # on one GPU (Liger installed from its wheel: benchmarks/gpu_wheels.py carries it)
    python benchmarks/bench_vs_liger.py --device cuda --json liger.json
    # a dry run on a CPU (tiny shapes; Liger's Triton kernel skipped, its chunked loss eager)
    python benchmarks/bench_vs_liger.py --device cpu --tokens 64 --hidden 32 --vocab 4096 \\
        --grad-tokens 32 --warmup 0 --repeats 1

The loss is the one distillation with the teacher's whole distribution computes: the generalized
Jensen-Shannon divergence (beta 0.5) between the student's and the teacher's softmax over the
full vocabulary, each made from final hidden states [BT, H] and an LM head [V, H], averaged over
the BT positions; the student's hidden states and head get gradients, the teacher is frozen.
Every input is bf16, as in a bf16 run. Systems:

    nemo_opd       the student's chunked loss path with loss_fn.support full: the student's
                   and the teacher's logits made per chunk of --chunk positions
                   (policy.logits_chunk_tokens, 256 by default; chunked_head_loss and
                   TeacherLogits.from_hidden) and the exact divergence in fp32 per block
                   (nemo_opd.losses.full_vocab), the gradient computed during the forward
    liger_fused    Liger's LigerFusedLinearJSD (its Triton kernel; CUDA only), as its users run
                   it: default settings (accum_dtype None)
    liger_fused_fp32_accum
                   the same with accum_dtype float32 (Liger's option for the weight
                   gradient's accumulation)
    liger_chunked  Liger's chunked distillation loss, LigerFusedLinearJSDLoss
                   (weight_hard_loss 0, weight_soft_loss 1, chunk_size 1024, compiled with
                   torch.compile on CUDA as by default; eager on the CPU)

Speed (--shapes, default Liger's own benchmark shape and Qwen3's vocabulary): the harness's
forward + backward (benchmarks/harness.py: CUDA-event medians of --repeats after --warmup) and
the peak memory above the inputs (torch.cuda.max_memory_allocated less what the inputs hold;
the weight gradient counts). Gradients (--grad-tokens positions, the shape's H and V): each
system's loss and gradients of the student's hidden states and LM head, against float64
autograd through the dense formula on the same bf16 inputs: the relative error
||g - g64|| / ||g64||. The check (issue 64, item 4): nemo_opd faster than liger_chunked, with no
more memory than liger_fused, at every shape.
"""

import argparse
import datetime
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import device_name, measure  # noqa: E402

BETA = 0.5
SHAPES = {
    "liger": (8192, 4096, 128256),  # Liger's benchmark shape: BT, H, V
    "qwen3": (8192, 4096, 151936),  # Qwen3's vocabulary at Qwen3-8B's hidden size
}
SYSTEMS = ("nemo_opd", "liger_fused", "liger_fused_fp32_accum", "liger_chunked")


def make_case(tokens: int, hidden: int, vocab: int, device: torch.device, seed: int = 0) -> dict:
    """bf16 student and teacher hidden states [tokens, hidden] and LM heads [vocab, hidden],
    scaled so that the logits spread as a trained model's do (the teacher's more peaked)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device, torch.bfloat16)

    return {
        "student_input": randn(tokens, hidden),
        "student_weight": randn(vocab, hidden, scale=2 * hidden**-0.5),
        "teacher_input": randn(tokens, hidden),
        "teacher_weight": randn(vocab, hidden, scale=4 * hidden**-0.5),
    }


def system_loss(name: str, device: torch.device, chunk: int):
    """loss(student_input, student_weight, teacher_input, teacher_weight) -> the mean JSD of
    `name` (a 0-d tensor whose backward fills the student's gradients)."""
    if name == "nemo_opd":
        return _nemo_opd_loss(chunk)
    if name.startswith("liger_fused"):
        if device.type != "cuda":
            raise RuntimeError("Liger's fused JSD is a Triton kernel: CUDA only")
        from liger_kernel.transformers import LigerFusedLinearJSD

        accum = torch.float32 if name.endswith("fp32_accum") else None
        module = LigerFusedLinearJSD(jsd_beta=BETA, accum_dtype=accum)
        return lambda si, sw, ti, tw: module(si, sw, ti, tw, None)
    from liger_kernel.chunked_loss import LigerFusedLinearJSDLoss

    module = LigerFusedLinearJSDLoss(
        weight_hard_loss=0.0,
        weight_soft_loss=1.0,
        beta=BETA,
        compiled=device.type == "cuda",
        chunk_size=1024,
    )

    def liger_chunked(si, sw, ti, tw):
        labels = torch.zeros(si.shape[0], dtype=torch.long, device=si.device)  # none ignored
        return module(si, sw, ti, tw, labels)

    return liger_chunked


def _nemo_opd_loss(chunk: int):
    from nemo_opd.losses.chunked_head import chunked_head_loss
    from nemo_opd.losses.divergence import TopkKLParams
    from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
    from nemo_opd.losses.teacher_logits import TeacherLogits

    full_fn = FullVocabDistillationLossFn(params=TopkKLParams(kl_type="jsd", jsd_beta=BETA))

    def loss(si, sw, ti, tw):
        count = float(si.shape[0])

        def chunk_loss(logits, part):  # the teacher's logits of the chunk from its hidden states
            teacher = TeacherLogits.from_hidden(
                part["teacher_hidden"], lambda rows: F.linear(rows, tw), tw.shape[0]
            )
            fields = {"loss_mask": part["loss_mask"], "teacher_logits": teacher}
            return full_fn(logits, fields, count)

        fields = {
            "loss_mask": torch.ones(1, si.shape[0], device=si.device),
            "teacher_hidden": ti.unsqueeze(0),
        }
        value, _ = chunked_head_loss(si.unsqueeze(0), sw, fields, chunk_loss, chunk=chunk)
        return value

    return loss


def reference_loss(si, sw, ti, tw) -> torch.Tensor:
    """The mean generalized JSD in float64, dense (the module docstring's formula)."""
    log_q = torch.log_softmax(si.double() @ sw.double().T, -1)
    with torch.no_grad():
        log_p = torch.log_softmax(ti.double() @ tw.double().T, -1)
    log_m = torch.logaddexp(log_p + math.log(BETA), log_q + math.log1p(-BETA))
    to_p = (log_p.exp() * (log_p - log_m)).sum(-1)
    to_q = (log_q.exp() * (log_q - log_m)).sum(-1)
    return (BETA * to_p + (1 - BETA) * to_q).mean()


def gradient_errors(name: str, case: dict, device: torch.device, chunk: int) -> dict:
    """The relative errors of `name`'s loss and student gradients against float64."""
    reference = _loss_and_grads(reference_loss, case, torch.float64)
    mine = _loss_and_grads(system_loss(name, device, chunk), case, None)
    errors = {"loss": abs(mine[0] - reference[0]) / abs(reference[0])}
    names = ("student_input", "student_weight")
    for label, got, want in zip(names, mine[1:], reference[1:], strict=True):
        errors[label] = float((got.double() - want).norm() / want.norm())
    return errors


def _loss_and_grads(loss_fn, case: dict, dtype) -> tuple:
    """(loss, d student_input, d student_weight) of loss_fn on the case's bf16 values (cast to
    dtype first when given: the same numbers, more bits)."""
    leaves = {
        key: value.detach().to(dtype or value.dtype).requires_grad_(key.startswith("student"))
        for key, value in case.items()
    }
    loss = loss_fn(*leaves.values())
    loss.backward()
    return float(loss.detach()), leaves["student_input"].grad, leaves["student_weight"].grad


def speed(name: str, case: dict, device: torch.device, args, shape: str):
    """The harness's measurement of `name` on `case`."""
    loss_fn = system_loss(name, device, args.chunk)

    def make_inputs():
        return {k: v.detach().requires_grad_(k.startswith("student")) for k, v in case.items()}

    tokens, vocab = case["student_input"].shape[0], case["student_weight"].shape[0]
    row = measure(
        name,
        {"shape": shape, "BT": tokens, "V": vocab},
        make_inputs,
        lambda inputs: loss_fn(*inputs.values()),
        lambda inputs, loss: loss.backward(),
        device=device,
        warmup=args.warmup,
        iters=args.repeats,
    )
    return row


def run(args) -> dict:
    device = torch.device(args.device)
    shapes = {name: SHAPES[name] for name in args.shapes}
    if args.tokens or args.hidden or args.vocab:  # one custom shape (the dry run's)
        tokens, hidden, vocab = SHAPES["qwen3"]
        shapes = {"custom": (args.tokens or tokens, args.hidden or hidden, args.vocab or vocab)}
    record = {
        "date": datetime.date.today().isoformat(),
        "device": device_name(device),
        "torch": torch.__version__,
        "liger_kernel": _liger_version(),
        "beta": BETA,
        "chunk": args.chunk,
        "speed": [],
        "gradients": [],
    }
    for shape, (tokens, hidden, vocab) in shapes.items():
        case = make_case(tokens, hidden, vocab, device)
        for name in args.systems:
            try:
                row = speed(name, case, device, args, shape)
            except Exception as error:  # a system this device cannot run: recorded, not fatal
                row = None
                record["speed"].append(
                    {"name": name, "shape": shape, "error": f"{type(error).__name__}: {error}"}
                )
            if row is not None:
                record["speed"].append({"shape": shape, **row.__dict__})
            _print_speed(record["speed"][-1])
        del case
        small = make_case(args.grad_tokens, hidden, vocab, device, seed=1)
        for name in args.systems:
            try:
                errors = gradient_errors(name, small, device, args.chunk)
            except Exception as error:
                errors = {"error": f"{type(error).__name__}: {error}"}
            record["gradients"].append({"name": name, "shape": shape, **errors})
            _print_errors(record["gradients"][-1])
        del small
        if device.type == "cuda":
            torch.cuda.empty_cache()
    record["check"] = check(record)
    print(f"check (nemo_opd faster than liger_chunked, no more memory than liger_fused): "
          f"{record['check']}", flush=True)  # fmt: skip
    return record


def check(record: dict) -> str:
    """'met', 'not met' (with the shape that misses) or 'not measured' (a system missing)."""
    by = {(row["shape"], row["name"]): row for row in record["speed"]}
    verdicts = []
    for shape in dict.fromkeys(row["shape"] for row in record["speed"]):
        ours, chunked = by.get((shape, "nemo_opd")), by.get((shape, "liger_chunked"))
        fused = by.get((shape, "liger_fused"))
        rows = (ours, chunked, fused)
        if any(row is None or row.get("total_ms") is None for row in rows):
            return "not measured"
        if ours["peak_memory_mb"] is None or fused["peak_memory_mb"] is None:
            return "not measured"
        faster = ours["total_ms"] < chunked["total_ms"]
        leaner = ours["peak_memory_mb"] <= fused["peak_memory_mb"]
        if not (faster and leaner):
            verdicts.append(f"{shape}: {'slower' if not faster else 'more memory'}")
    return "met" if not verdicts else "not met (" + "; ".join(verdicts) + ")"


def _liger_version() -> str | None:
    import importlib.metadata

    try:
        return importlib.metadata.version("liger-kernel")
    except importlib.metadata.PackageNotFoundError:
        return None


def _print_speed(row: dict) -> None:
    if row.get("error"):
        print(f"{row['shape']:>7} {row['name']:<24} {row['error']}", flush=True)
        return
    memory = row["peak_memory_mb"]
    memory = "" if memory is None else f", peak {memory / 1024:.2f} GiB above the inputs"
    print(f"{row['shape']:>7} {row['name']:<24} {row['total_ms']:9.1f} ms{memory}", flush=True)


def _print_errors(row: dict) -> None:
    if row.get("error"):
        print(f"{'grads':>7} {row['name']:<24} {row['error']}", flush=True)
        return
    keys = ("loss", "student_input", "student_weight")
    parts = ", ".join(f"{key} {row[key]:.2e}" for key in keys)
    print(f"{'grads':>7} {row['name']:<24} relative error: {parts}", flush=True)


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--tokens", type=int, help="a custom shape's BT (instead of --shapes)")
    parser.add_argument("--hidden", type=int, help="a custom shape's H")
    parser.add_argument("--vocab", type=int, help="a custom shape's V")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--chunk", type=int, default=256, help="nemo_opd's logits_chunk_tokens")
    parser.add_argument("--grad-tokens", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    record = run(args)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
