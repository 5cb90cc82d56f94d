"""A training engine built in this process (world size 1, no Ray), as a worker builds it.

    # throughput at Qwen3-1.7B's shape (random weights, bf16): training tokens/s unpacked and
    # packed, teacher top-k tokens/s, peak memory
    python benchmarks/bench_engine.py throughput --device cuda --json engine.json
    # the tiny task's models: one teacher top-k phase and two training steps, as JSON
    python benchmarks/bench_engine.py parity --device cpu --json cpu.json
    python benchmarks/bench_engine.py parity --device cuda --backend megatron --json mcore.json
    # compare two parity runs (exit status 1 when they disagree)
    python benchmarks/bench_engine.py compare cpu.json mcore.json
    # one float32 process: the DTensor engine FSDP-wrapped against unwrapped, the tiny student
    python benchmarks/bench_engine.py world1 --device cpu --json world1.json

throughput: a Qwen3 model of --shape (qwen3-1.7b: hidden 2048, 28 layers, 16 heads, 8 KV
heads, head_dim 128, MLP 6144, vocabulary 151936, tied embeddings; tiny: a 2-layer model for a
smoke run) is saved with random weights, then loaded by the engine (DTensorEngine or
MegatronEngine, --backend) exactly as a worker loads a checkpoint. A batch of --rows rows with
lengths drawn uniformly from [--seq / 4, --seq] and a random teacher top-k (k = --k) is trained
on with DistillationLossFn (the fused kernel on CUDA, `implementation="auto"`), first in
padded microbatches of --micro rows, then sequence-packed (microbatches of --micro x --seq
tokens); tokens/s counts the rows' real tokens over the median wall time of --repeats calls of
Engine.train (one optimizer step each) after one warm-up call. The packed phase runs once per
--packed-attention choice (dtensor_cfg.packed_attention: per_segment, one attention call per
sequence; varlen, every sequence of a microbatch in one call of torch's varlen flash attention,
CUDA only). The teacher phase times Engine.get_topk_logits on the same batch, packed, once per
choice. Peak memory is torch.cuda.max_memory_allocated
during each phase. Packing and padding share one engine (its microbatching setting is switched
between the phases; weights keep training).

parity: the tiny task's prebuilt teacher and student in float32: the teacher's top-k on a
seeded batch, then two training steps of the student on it (the distillation loss on the
teacher's top-k). compare checks losses, gradient norms and the teacher's top-k log-probs to
a relative 1e-3 and the top-k ids to 99% agreement (ties may order differently on another
device).

world1: the DTensor engine of one float32 process as it runs (unwrapped, dtensor.needs_fsdp)
and forced through FSDP2, both built from the tiny student with the tiny recipe's batching
(64 rows of 30-60 tokens, two optimizer steps of two 16-row microbatches, the top-16 forward
KL), trained in turns on the same batches, each batch then scored for its top-16 as the
teacher's worker scores a step's rollouts: the median of this process's CPU seconds
(time.process_time, which a loaded machine disturbs far less than wall time) per
Engine.train and Engine.get_topk_logits call on one thread, and whether both took the same
steps (losses and gradient norms equal to a relative 1e-5).
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SHAPES = {
    "qwen3-0.6b": dict(
        hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    ),
    "qwen3-8b": dict(
        hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=False,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    ),
    "qwen3-1.7b": dict(
        hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
        num_key_value_heads=8, head_dim=128, vocab_size=151936, tie_word_embeddings=True,
        max_position_embeddings=40960, rope_theta=1000000.0, rms_norm_eps=1e-6,
    ),
    "tiny": dict(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=1024, tie_word_embeddings=True,
        max_position_embeddings=512, rms_norm_eps=1e-6,
    ),
}  # fmt: skip
PARITY_RTOL = 1e-3
PARITY_ID_AGREEMENT = 0.99


def build_engine(model_dir: str, device: torch.device, backend: str, precision: str, **policy):
    """An engine of world size 1 in this process: the process group (gloo on CPU, nccl on
    CUDA) and the meshes, then the backend's engine with an optimizer (frozen when
    `policy` says optimizer=None)."""
    import torch.distributed as dist

    from nemo_opd.config import PolicyConfig
    from nemo_opd.distributed.parallel_dims import ParallelDims
    from nemo_opd.distributed.process_group import find_free_port, init_distributed

    if not dist.is_initialized():
        init_distributed(0, 1, "127.0.0.1", find_free_port(), device.type, timeout_s=120)
    raw = {
        "model_name": model_dir,
        "tokenizer": {"name": model_dir},
        "precision": precision,
        "max_grad_norm": 1.0,
        "optimizer": {"lr": 1e-5, "weight_decay": 0.01},
        "scheduler": {"warmup_steps": 0},
        **policy,
    }
    if backend == "megatron":
        raw["dtensor_cfg"] = {"enabled": False}
        raw["megatron_cfg"] = {"enabled": True}
    cfg = PolicyConfig.model_validate(raw)
    dims = ParallelDims(world_size=1, device_type=device.type)
    dims.build_mesh()
    with_optimizer = cfg.optimizer is not None
    if backend == "megatron":
        from nemo_opd.policy.engines.megatron import MegatronEngine

        return MegatronEngine(cfg, dims, device, with_optimizer, total_steps=100)
    from nemo_opd.policy.engines.dtensor import DTensorEngine

    return DTensorEngine(cfg, dims, device, with_optimizer, total_steps=100)


def make_batch(rows: int, seq: int, vocab: int, k: int, seed: int, min_len: int) -> dict:
    """Right-padded rows of lengths in [min_len, seq] (the first one full), every position
    after the first graded, and a random teacher top-k over the vocabulary."""
    from nemo_opd.data.batching import TensorBatch

    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, seq + 1, (rows,), generator=gen)
    lengths[0] = seq
    positions = torch.arange(seq)
    valid = positions < lengths.unsqueeze(1)
    ids = torch.where(valid, torch.randint(1, vocab, (rows, seq), generator=gen), 0)
    scores = torch.randn(rows, seq, k, generator=gen) * 2
    values = torch.log_softmax(scores, -1) - 0.05  # the teacher's top-k holds 95% of the mass
    indices = torch.stack([torch.randperm(vocab, generator=gen)[:k] for _ in range(64)])
    indices = indices[torch.randint(0, 64, (rows, seq), generator=gen)]
    return TensorBatch(
        input_ids=ids,
        input_lengths=lengths,
        token_mask=((positions >= 1) & valid).float(),
        sample_mask=torch.ones(rows),
        teacher_topk_logprobs=values.sort(-1, descending=True).values,
        teacher_topk_indices=indices.to(torch.int32),
    )


def save_random_model(shape: str, root: Path, device: torch.device, seed: int = 0) -> str:
    """A Qwen3 model of `shape` with random weights saved in bf16 under root (built on
    `device`, which is fast on a GPU); returns its directory."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    torch.manual_seed(seed)
    config = Qwen3Config(**SHAPES[shape])
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    path = root / shape
    model.save_pretrained(path)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return str(path)


def timed(device: torch.device, call, repeats: int) -> tuple[float, float]:
    """(median seconds of `repeats` calls after one warm-up, peak memory GiB over them)."""
    call()
    sync(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return statistics.median(times), peak


def measure(record: dict, key: str, title: str, tokens: int, device, call, repeats: int) -> None:
    """record[key + "_tokens_per_s"] and [key + "_peak_gib"] of timed(call), printed; a phase
    that fails is recorded (key + "_error") and printed, and the others still run."""
    try:
        seconds, peak = timed(device, call, repeats)
    except Exception as error:  # a choice the device cannot run: the other phases still count
        record[f"{key}_error"] = f"{type(error).__name__}: {error}"
        print(f"{title}: failed: {record[f'{key}_error']}", flush=True)
        return
    record[f"{key}_tokens_per_s"] = round(tokens / seconds, 1)
    record[f"{key}_peak_gib"] = None if peak is None else round(peak, 2)
    print(f"{title}: {tokens / seconds:,.0f} tokens/s{gib(peak)}", flush=True)


def gib(peak: float | None) -> str:
    return "" if peak is None else f", peak {peak:.1f} GiB"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def throughput(args) -> dict:
    """Training (padded, packed) and teacher top-k tokens/s of one engine (module docstring)."""
    from nemo_opd.losses import DistillationLossFn, TopkKLParams

    device = torch.device(args.device)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        start = time.perf_counter()
        model_dir = save_random_model(args.shape, Path(tmp), device)
        saved = time.perf_counter() - start
        micro_tokens = args.micro * args.seq
        engine = build_engine(
            model_dir, device, args.backend, args.precision,
            train_global_batch_size=args.rows, train_micro_batch_size=args.micro,
            logprob_batch_size=args.micro, max_total_sequence_length=args.seq,
            logits_chunk_tokens=args.chunk,
        )  # fmt: skip
        built = time.perf_counter() - start - saved
    vocab = SHAPES[args.shape]["vocab_size"]
    batch = make_batch(args.rows, args.seq, vocab, args.k, seed=1, min_len=max(2, args.seq // 4))
    tokens = int(batch["input_lengths"].sum())
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"), implementation="auto")
    record = {
        "shape": args.shape, "backend": args.backend, "precision": args.precision,
        "rows": args.rows, "seq": args.seq, "micro": args.micro, "k": args.k,
        "tokens": tokens, "logits_chunk_tokens": args.chunk,
        "save_s": round(saved, 2), "build_s": round(built, 2),
    }  # fmt: skip
    padded = engine.cfg
    packing = {"enabled": True, "train_mb_tokens": micro_tokens, "logprob_mb_tokens": micro_tokens}
    packed = padded.model_copy(
        update={"sequence_packing": padded.sequence_packing.model_copy(update=packing)}
    )
    phases = [("padded", padded)]
    for choice in args.packed_attention:  # packed rows attending per segment, or in one call
        label = "packed" if choice == "per_segment" else f"packed_{choice}"
        dtensor_cfg = packed.dtensor_cfg.model_copy(update={"packed_attention": choice})
        phases.append((label, packed.model_copy(update={"dtensor_cfg": dtensor_cfg})))
    losses = []

    def train():
        losses.append(engine.train(batch, loss_fn, args.rows)["loss"][0])

    for label, cfg in phases:
        engine.cfg = cfg
        measure(record, f"train_{label}", f"train {label}", tokens, device, train, args.repeats)
    record["losses"] = losses
    for label, cfg in phases[1:]:
        engine.cfg = cfg
        score = lambda: engine.get_topk_logits(batch, args.k)  # noqa: E731
        name = "teacher_topk" + label.removeprefix("packed")
        measure(record, name, f"teacher top-k, {label}", tokens, device, score, args.repeats)
    if not all(torch.isfinite(torch.tensor(losses))):
        raise SystemExit(f"non-finite training loss: {losses}")
    return record


def parity(args) -> dict:
    """The tiny task's teacher top-k and two student training steps (module docstring)."""
    import torch.distributed as dist

    from nemo_opd.losses import DistillationLossFn, TopkKLParams
    from nemo_opd.tiny import resolve_pretrained

    device = torch.device(args.device)
    k, rows, seq = 8, 8, 48
    common = dict(
        train_global_batch_size=rows // 2, train_micro_batch_size=2, logprob_batch_size=4,
        max_total_sequence_length=seq, logits_chunk_tokens=32,
    )  # fmt: skip
    teacher_dir = str(resolve_pretrained("tiny:teacher"))
    student_dir = str(resolve_pretrained("tiny:student"))
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(student_dir).vocab_size
    batch = make_batch(rows, seq, vocab, k, seed=3, min_len=12)
    teacher = build_engine(
        teacher_dir, device, args.backend, "float32", **common, optimizer=None, scheduler=None
    )
    values, indices = teacher.get_topk_logits(batch, k)
    del teacher
    batch["teacher_topk_logprobs"], batch["teacher_topk_indices"] = values, indices
    torch.manual_seed(0)
    student = build_engine(student_dir, device, args.backend, "float32", **common)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"), implementation="auto")
    history = student.train(batch, loss_fn, rows // 2)
    dist.barrier()
    return {
        "backend": args.backend,
        "device": args.device,
        "teacher_topk_logprobs": values.tolist(),
        "teacher_topk_indices": indices.tolist(),
        "loss": history["loss"],
        "grad_norm": history["grad_norm"],
    }


def grouped_batch(prompts: int, samples: int, prompt_len: int, new_tokens: int, vocab: int):
    """`samples` rows per prompt in the loop's order: the prompt's tokens, then a response of
    new_tokens / 2 to new_tokens tokens, every response token graded."""
    from nemo_opd.data.batching import TensorBatch

    gen = torch.Generator().manual_seed(0)
    width = prompt_len + new_tokens
    rows = prompts * samples
    ids = torch.zeros(rows, width, dtype=torch.long)
    lengths = torch.zeros(rows, dtype=torch.long)
    for p in range(prompts):
        prompt = torch.randint(1, vocab, (prompt_len,), generator=gen)
        for s in range(samples):
            r = p * samples + s
            length = prompt_len + int(
                torch.randint(new_tokens // 2, new_tokens + 1, (1,), generator=gen)
            )
            ids[r, :prompt_len] = prompt
            ids[r, prompt_len:length] = torch.randint(
                1, vocab, (length - prompt_len,), generator=gen
            )
            lengths[r] = length
    positions = torch.arange(width)
    token_mask = (positions >= prompt_len) & (positions < lengths.unsqueeze(1))
    return TensorBatch(
        input_ids=ids,
        input_lengths=lengths,
        token_mask=token_mask.float(),
        sample_mask=torch.ones(rows),
    )


def prefix(args) -> dict:
    """A teacher's scoring (its top-k of the graded positions, as the loop asks for it) of
    --prompts prompts x --samples samples, each row run whole against shared-prefix scoring
    (dtensor_cfg.shared_prefix_scoring): seconds, tokens/s of the rows' tokens, the tokens
    each ran forward, and the largest difference between their top-k log-probs."""
    device = torch.device(args.device)
    if args.threads:
        torch.set_num_threads(args.threads)
    vocab = SHAPES[args.shape]["vocab_size"]
    batch = grouped_batch(args.prompts, args.samples, args.prompt_len, args.new_tokens, vocab)
    tokens, width = int(batch["input_lengths"].sum()), batch["input_ids"].shape[1]
    budget = args.mb_tokens
    packing = {"enabled": True, "train_mb_tokens": budget, "logprob_mb_tokens": budget}
    record = {
        "shape": args.shape, "precision": args.precision, "prompts": args.prompts,
        "samples": args.samples, "prompt_len": args.prompt_len, "new_tokens": args.new_tokens,
        "k": args.k, "mb_tokens": budget, "tokens": tokens,
    }  # fmt: skip
    scores = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        model_dir = save_random_model(args.shape, Path(tmp), device)
        for shared in (False, True):
            engine = build_engine(
                model_dir, device, "dtensor", args.precision, optimizer=None, scheduler=None,
                logprob_batch_size=args.samples, max_total_sequence_length=width,
                logits_chunk_tokens=args.chunk, sequence_packing=packing,
                dtensor_cfg={"shared_prefix_scoring": shared},
            )  # fmt: skip
            forwarded = []
            run_forward = engine._forward_hidden

            def counted(mb, run_forward=run_forward, forwarded=forwarded):
                forwarded.append(int(mb.input_ids.numel()))
                return run_forward(mb)

            engine._forward_hidden = counted

            def score(engine=engine):
                return engine.score(batch, topk=args.k, trained_only=True)

            seconds, peak = timed(device, score, args.repeats)
            label = "shared_prefix" if shared else "whole"
            scores[label] = score()["topk_logprobs"]
            runs = args.repeats + 2  # the warm-up, the timed calls, the one kept
            record[f"{label}_seconds"] = round(seconds, 4)
            record[f"{label}_tokens_per_s"] = round(tokens / seconds, 1)
            record[f"{label}_tokens_forward"] = sum(forwarded) // runs
            record[f"{label}_peak_gib"] = None if peak is None else round(peak, 2)
            print(f"{label}: {seconds:.3f} s, {tokens / seconds:,.0f} tokens/s, "
                  f"{sum(forwarded) // runs:,} tokens forward{gib(peak)}", flush=True)  # fmt: skip
            del engine
    difference = float((scores["shared_prefix"] - scores["whole"]).abs().max())
    record["topk_logprobs_max_difference"] = difference
    record["speedup"] = round(record["whole_seconds"] / record["shared_prefix_seconds"], 2)
    print(f"speed-up {record['speedup']}x; top-k log-probs differ by at most {difference:.2e}")
    return record


def world1(args) -> dict:
    """The unwrapped and the FSDP-wrapped engine of one process, in turns (module docstring)."""
    import nemo_opd.policy.engines.dtensor as dtensor
    from nemo_opd.config import load_config
    from nemo_opd.losses import DistillationLossFn
    from nemo_opd.tiny import resolve_pretrained

    torch.set_num_threads(1)
    device = torch.device(args.device)
    cfg = load_config(str(ROOT / "examples/configs/distillation_tiny_100_lockstep.yaml"), [])
    batching = dict(
        train_global_batch_size=32, train_micro_batch_size=16, logprob_batch_size=64,
        max_total_sequence_length=128,
    )  # fmt: skip
    as_run = dtensor.needs_fsdp
    engines = {}
    for label, wrap in (("fsdp", lambda *a: True), ("unwrapped", as_run)):
        dtensor.needs_fsdp = wrap
        try:
            engines[label] = build_engine(
                str(resolve_pretrained("tiny:student")), device, "dtensor", "float32", **batching
            )
        finally:
            dtensor.needs_fsdp = as_run
    loss_fn = DistillationLossFn.from_config(cfg.loss_fn)
    vocab = engines["fsdp"].vocab_size
    seconds = {label: [] for label in engines}
    steps = {label: [] for label in engines}
    scoring = {label: [] for label in engines}
    for seed in range(args.repeats + 1):
        batch = make_batch(64, 60, vocab, 16, seed=seed, min_len=30)
        for label, engine in engines.items():
            start = time.process_time()
            history = engine.train(batch, loss_fn, 32)
            scored = time.process_time()
            engine.get_topk_logits(batch, 16)  # what the teacher's worker does each step
            if seed:  # the first calls warm up
                seconds[label].append(scored - start)
                scoring[label].append(time.process_time() - scored)
            steps[label] += history["loss"] + history["grad_norm"]
    same = torch.allclose(torch.tensor(steps["unwrapped"]), torch.tensor(steps["fsdp"]), 1e-5)
    record = {label: round(statistics.median(s), 4) for label, s in seconds.items()}
    record.update({f"{label}_topk": round(statistics.median(s), 4) for label, s in scoring.items()})
    record.update(repeats=args.repeats, same_steps=same)
    for what, key in (("train", ""), ("top-k", "_topk")):
        wrapped, unwrapped = record[f"fsdp{key}"], record[f"unwrapped{key}"]
        print(
            f"CPU seconds per {what} call (median of {args.repeats}): FSDP-wrapped {wrapped}, "
            f"unwrapped {unwrapped} ({unwrapped / wrapped:.2f}x)",
            flush=True,
        )
    print(f"same steps: {same}", flush=True)
    return record


def compare(paths: list[Path]) -> int:
    """Print how two parity records differ; 0 when within PARITY_RTOL / PARITY_ID_AGREEMENT."""
    a, b = (json.loads(Path(p).read_text()) for p in paths)
    checks = []
    for name in ("loss", "grad_norm", "teacher_topk_logprobs"):
        x, y = (
            torch.tensor(a[name], dtype=torch.float64),
            torch.tensor(b[name], dtype=torch.float64),
        )
        rel = float((x - y).norm() / y.norm().clamp(min=1e-12))
        checks.append((name, f"relative difference {rel:.2e}", rel <= PARITY_RTOL))
    ids_a, ids_b = torch.tensor(a["teacher_topk_indices"]), torch.tensor(b["teacher_topk_indices"])
    agreement = float((ids_a == ids_b).float().mean())
    checks.append(("teacher_topk_indices", f"agreement {agreement:.4f}", agreement >= 0.99))
    label = f"{a['backend']}/{a['device']} vs {b['backend']}/{b['device']}"
    for name, text, ok in checks:
        print(f"{label}  {name:22} {text:32} {'pass' if ok else 'FAIL'}")
    print(f"{label}  losses {a['loss']} vs {b['loss']}")
    return 0 if all(ok for _, _, ok in checks) else 1


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    for mode in ("throughput", "parity", "world1", "prefix"):
        p = sub.add_parser(mode)
        p.add_argument("--device", default="cuda")
        if mode != "prefix":  # shared-prefix scoring is the DTensor engine's
            p.add_argument("--backend", default="dtensor", choices=["dtensor", "megatron"])
        p.add_argument("--json", type=Path)
        if mode in ("throughput", "prefix"):  # a random model of a shape, its teacher top-k
            shape, chunk = ("qwen3-1.7b", 1024) if mode == "throughput" else ("qwen3-8b", 256)
            p.add_argument("--shape", default=shape, choices=sorted(SHAPES))
            p.add_argument("--precision", default="bfloat16")
            p.add_argument("--k", type=int, default=64)
            p.add_argument("--chunk", type=int, default=chunk, help="logits_chunk_tokens")
            p.add_argument("--repeats", type=int, default=2)
            p.add_argument("--tmp", default=None, help="where the random model is saved")
        if mode == "throughput":
            p.add_argument("--rows", type=int, default=16)
            p.add_argument("--seq", type=int, default=2048)
            p.add_argument("--micro", type=int, default=2)
            p.add_argument(
                "--packed-attention",
                nargs="+",
                default=["per_segment"],
                choices=["per_segment", "varlen", "auto"],
                help="dtensor_cfg.packed_attention of the packed phases, one phase each",
            )
        if mode == "world1":
            p.add_argument("--repeats", type=int, default=8)
        if mode == "prefix":
            p.add_argument("--prompts", type=int, default=4)
            p.add_argument("--samples", type=int, default=16)
            p.add_argument("--prompt-len", type=int, default=512)
            p.add_argument("--new-tokens", type=int, default=512)
            p.add_argument("--mb-tokens", type=int, default=16384, help="logprob_mb_tokens")
            p.add_argument("--threads", type=int, default=0, help="torch threads (0: default)")
    p = sub.add_parser("compare")
    p.add_argument("records", type=Path, nargs=2)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode == "compare":
        return compare(args.records)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --device cpu", file=sys.stderr)
        return 2
    modes = {"throughput": throughput, "parity": parity, "world1": world1, "prefix": prefix}
    record = modes[args.mode](args)
    record["device_name"] = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
