"""The loss path at a real vocabulary: peak memory and time, chunked, unchunked and TRL's GKD loss.

    uv run --extra cpu --group bench python benchmarks/bench_scale.py \\
        [--device cpu] [--vocab 151936] [--hidden 1024] [--tokens 1024 4096 16384] \\
        [--k 64] [--chunk 256 1024] [--json PATH]

Two paths, from final hidden states (what the model body hands the LM head):
    student  one forward + backward: hidden [N, H] -> LM head [V, H] -> the loss -> gradients
             of the hidden states and the LM-head weight
    teacher  one top-k: hidden [N, H] -> LM head -> top-k log-probs and ids (no gradient)
Four implementations:
    chunked    nemo_opd's: the LM head and the loss over chunks of --chunk positions
               (nemo_opd.losses.chunked_head); the top-k per chunk; one run per chunk size
    full       nemo_opd's exact full-vocabulary divergence (loss_fn.support full): the student
               path also holds the teacher's LM head [V, H] (frozen, bf16) and its hidden
               states, and per chunk computes the teacher's logits next to its own; the teacher
               path is its hidden states (nothing per chunk: what it sends); chunked like
               `chunked`
    unchunked  nemo_opd's loss on the whole [N, V] logits (policy.logits_chunk_tokens=null)
    trl        TRL's GKD (trl.experimental.gkd.GKDTrainer.generalized_jsd_loss, beta 0: the
               forward KL), which takes the student's and the teacher's whole [N, V] logits;
               its teacher path is the teacher's logits and log-softmax the loss reads
The loss is the top-k forward KL (k = --k, bucket tail), the default objective of the tiny run,
with the implementation a run picks ("auto": the fused Triton kernel on CUDA, torch on CPU).

Each (implementation, path, N) runs in a process of its own, which measures its peak memory
above what its inputs hold: on CPU the peak resident set (VmHWM) minus the resident set once
the inputs are built, on CUDA torch.cuda.max_memory_allocated minus the allocation before the
run. Its time is the median of --repeats runs after one warm-up (perf_counter on CPU, CUDA
events on CUDA). A run that does not fit (MemoryError, CUDA out of memory, or killed) is
recorded as such. The process's address space is capped at --memory-gb so that a run that
does not fit fails instead of swapping.

The JSON holds `results`, one record per run: impl, path, tokens, chunk (chunked and full),
peak_bytes, held_bytes (what the path holds besides hidden states and LM head, built before the
measurement: the teacher's top-k, or for `full` its hidden states and its LM head), seconds
(null when it did not fit, with `error`), plus the device and the date.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

IMPLS = ("chunked", "unchunked", "trl", "full")
PATHS = ("student", "teacher")


def build_inputs(args, device: torch.device) -> dict:
    """Hidden states, LM-head weights and a teacher top-k of the sizes asked for (seeded)."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    n, v, h, k = args.tokens_one, args.vocab, args.hidden, args.k
    hidden = torch.randn(n, h, generator=gen).to(device)
    weight = (torch.randn(v, h, generator=gen) * h**-0.5).to(device)
    inputs = {"hidden": hidden, "weight": weight}
    if args.path == "student":
        ids = torch.stack([torch.randperm(v, generator=gen)[:k] for _ in range(8)])
        ids = ids[torch.arange(n) % 8]  # distinct ids per row (8 patterns, reused)
        values = torch.log_softmax(torch.randn(n, k, generator=gen), -1) - 0.1  # tail 1 - e^-0.1
        inputs["fields"] = {
            "loss_mask": torch.ones(1, n, device=device),
            "teacher_topk_logprobs": values.unsqueeze(0).to(device),
            "teacher_topk_indices": ids.unsqueeze(0).to(device),
        }
        if args.impl in ("trl", "full"):
            inputs["teacher_hidden"] = torch.randn(n, h, generator=gen).to(device)
        if args.impl == "full":
            teacher_weight = torch.randn(v, h, generator=gen) * h**-0.5
            inputs["teacher_weight"] = teacher_weight.to(device, torch.bfloat16)
    return inputs


def run_once(args, inputs: dict) -> None:
    """One run of the path with the implementation (see the module docstring)."""
    from nemo_opd.distributed.vocab_parallel import vocab_parallel_topk
    from nemo_opd.losses import DistillationLossFn, TopkKLParams
    from nemo_opd.losses.chunked_head import chunked_head_loss, chunked_scores

    hidden, weight = inputs["hidden"], inputs["weight"]
    n = hidden.shape[0]
    if args.path == "teacher":
        if args.impl == "full":  # the hidden states themselves, what the teacher sends
            with torch.no_grad():
                hidden.to(torch.bfloat16)
            return
        if args.impl == "chunked":
            out_v = torch.empty(n, args.k, device=hidden.device)
            out_i = torch.empty(n, args.k, dtype=torch.int32, device=hidden.device)

            def keep(logits, start, end):
                out_v[start:end], out_i[start:end] = vocab_parallel_topk(logits, args.k, 0, None)

            chunked_scores(hidden, weight, keep, chunk=args.chunk)
        elif args.impl == "unchunked":
            with torch.no_grad():
                vocab_parallel_topk(_linear(hidden, weight), args.k, 0, None)
        else:  # what TRL's loss reads of its teacher: the whole log-softmax
            with torch.no_grad():
                torch.log_softmax(_linear(hidden, weight).float(), -1)
        return
    h = hidden.detach().requires_grad_()
    w = weight.detach().requires_grad_()
    if args.impl == "trl":
        from trl.experimental.gkd.gkd_trainer import GKDTrainer

        with torch.no_grad():
            teacher_logits = _linear(inputs["teacher_hidden"], weight)
        student_logits = _linear(h, w)
        loss = GKDTrainer.generalized_jsd_loss(
            student_logits.unsqueeze(0), teacher_logits.unsqueeze(0), beta=0.0
        )
        loss.backward()
        return
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="forward"), implementation="auto")
    fields, count = inputs["fields"], float(n)
    if args.impl == "full":
        from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
        from nemo_opd.losses.teacher_logits import TeacherLogits

        full_fn = FullVocabDistillationLossFn(params=TopkKLParams(kl_type="forward"))
        teacher_weight = inputs["teacher_weight"]

        def head(rows):
            return _linear(rows.to(teacher_weight.dtype), teacher_weight)

        def chunk_loss(z, part):  # what the engine does with the teacher's hidden states
            teacher = TeacherLogits.from_hidden(part["teacher_hidden"], head, args.vocab)
            return full_fn(z, {"loss_mask": part["loss_mask"], "teacher_logits": teacher}, count)

        fields = {
            "loss_mask": inputs["fields"]["loss_mask"],
            "teacher_hidden": inputs["teacher_hidden"].unsqueeze(0),
        }
        loss, _ = chunked_head_loss(h.unsqueeze(0), w, fields, chunk_loss, chunk=args.chunk)
    elif args.impl == "unchunked":
        loss, _ = loss_fn(_linear(h, w).unsqueeze(0), fields, count)
    else:
        hidden3 = h.unsqueeze(0)
        loss, _ = chunked_head_loss(
            hidden3, w, fields, lambda z, p: loss_fn(z, p, count), chunk=args.chunk
        )
    loss.backward()


def _linear(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(hidden, weight)


def held_bytes(args) -> int:
    """Bytes the path holds besides hidden states and LM head (built before the measurement,
    so not in peak_bytes): the teacher's top-k, or its hidden states and LM head (`full`), or
    its hidden states (`trl`, which makes its logits inside the measurement)."""
    n, v, h, k = args.tokens_one, args.vocab, args.hidden, args.k
    if args.path == "teacher":
        return 0
    if args.impl == "full":
        return n * h * 4 + v * h * 2  # fp32 hidden states here, the bf16 teacher LM head
    if args.impl == "trl":
        return n * h * 4
    return n * k * 8  # fp32 log-probs and int64 ids


def vm_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as status:
        line = next(row for row in status if row.startswith(f"{field}:"))
    return int(line.split()[1])


def reset_peak() -> None:
    """Make VmHWM restart from the current resident set (Linux: write 5 to clear_refs)."""
    with open("/proc/self/clear_refs", "w") as refs:
        refs.write("5")


def child(args) -> dict:
    """Measure one (impl, path, tokens) in this process; the record for the JSON."""
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    if args.memory_gb:
        limit = int(args.memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.RLIM_INFINITY))
    record = {"impl": args.impl, "path": args.path, "tokens": args.tokens_one}
    record["held_bytes"] = held_bytes(args)
    if args.impl in ("chunked", "full"):
        record["chunk"] = args.chunk
    try:
        inputs = build_inputs(args, device)
        run_once(args, inputs)  # warm-up, and the memory measurement
        if device.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            run_once(args, inputs)
            torch.cuda.synchronize()
            record["peak_bytes"] = torch.cuda.max_memory_allocated() - base
        else:
            base = vm_kib("VmRSS")
            reset_peak()
            run_once(args, inputs)
            record["peak_bytes"] = (vm_kib("VmHWM") - base) * 1024
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run_once(args, inputs)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        record["seconds"] = statistics.median(times)
    except (MemoryError, torch.OutOfMemoryError, RuntimeError) as error:
        reason = str(error).strip().splitlines()[0][:120] if str(error).strip() else ""
        record.update(peak_bytes=None, seconds=None, error=f"did not fit: {type(error).__name__}")
        if reason:
            record["error"] += f" ({reason})"
    return record


def parent(args) -> list[dict]:
    """Every (tokens, path, impl) in a fresh process, one after the other."""
    results = []
    for tokens in args.tokens:
        for path in PATHS:
            for impl in args.impls:
                for chunk in args.chunk if impl in ("chunked", "full") else args.chunk[:1]:
                    command = [
                        sys.executable, __file__, "--one", impl, path, str(tokens),
                        f"--chunk={chunk}", *_shared_flags(args),
                    ]  # fmt: skip
                    done = subprocess.run(command, capture_output=True, text=True)
                    if done.returncode == 0 and done.stdout.strip():
                        record = json.loads(done.stdout.strip().splitlines()[-1])
                    else:
                        last = (done.stderr.strip().splitlines() or [""])[-1][:160]
                        record = {
                            "impl": impl,
                            "path": path,
                            "tokens": tokens,
                            "peak_bytes": None,
                            "seconds": None,
                            "error": f"process ended with status {done.returncode}: {last}",
                        }
                        if impl in ("chunked", "full"):
                            record["chunk"] = chunk
                    results.append(record)
                    print(_row(record), flush=True)
    return results


def _shared_flags(args) -> list[str]:
    return [
        f"--device={args.device}", f"--vocab={args.vocab}", f"--hidden={args.hidden}",
        f"--k={args.k}", f"--repeats={args.repeats}",
        f"--threads={args.threads}", f"--memory-gb={args.memory_gb}",
    ]  # fmt: skip


def _row(record: dict) -> str:
    peak = record["peak_bytes"]
    peak = f"{peak / 2**30:7.2f} GiB" if peak is not None else "        -"
    peak += f" +{record.get('held_bytes', 0) / 2**30:5.2f}"
    seconds = f"{record['seconds']:8.3f} s" if record["seconds"] is not None else "        -"
    note = f"  {record['error']}" if "error" in record else ""
    impl = record["impl"] + (f"/{record['chunk']}" if "chunk" in record else "")
    return f"{record['tokens']:>6} {record['path']:8} {impl:14} {peak} {seconds}{note}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1024, 4096, 16384])
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument(
        "--chunk", type=int, nargs="+", default=[256], help="positions per chunk (each is a run)"
    )
    parser.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--memory-gb", type=float, default=20.0, help="address-space cap (CPU); 0 for none"
    )
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--one", nargs=3, metavar=("IMPL", "PATH", "TOKENS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.one:
        args.impl, args.path, args.tokens_one = args.one[0], args.one[1], int(args.one[2])
        args.chunk = args.chunk[-1]
        print(json.dumps(child(args)))
        return
    if "trl" in args.impls and importlib.util.find_spec("trl") is None:
        parser.error(
            "--impls trl needs TRL, the peer's package: install it with `uv sync --extra cpu "
            "--group bench`, or leave it out with --impls chunked unchunked"
        )
    print(f"{'tokens':>6} {'path':8} {'impl':14} {'peak + held':>18} {'time':>10}", flush=True)
    results = parent(args)
    if args.json:
        from harness import device_name, run_meta

        meta = {
            **run_meta(),
            "device": device_name(torch.device(args.device)),
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "vocab": args.vocab, "hidden": args.hidden, "k": args.k, "chunk": args.chunk,
            "platform": platform.platform(),
        }  # fmt: skip
        args.json.write_text(json.dumps({"meta": meta, "results": results}, indent=2))


if __name__ == "__main__":
    main()
