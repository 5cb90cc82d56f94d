"""The whole loop at Qwen3's vocabulary size on CPU: the tiny pair against the same bodies with
151,936-row embeddings (nemo_opd.tiny.wide_vocab), seconds per step and peak memory per process.

    uv run --extra cpu python benchmarks/bench_wide_vocab.py --out runs/bench_wide_vocab \\
        [--steps 10] [--config examples/configs/distillation_tiny.yaml] [OVERRIDE ...]

1. Builds the wide pair into OUT/models (python -m nemo_opd.tiny.wide_vocab), unless there.
2. Runs the config (the embedded default) for --steps steps with each pair, one after the
   other, each as the README's command in a fresh process: vLLM generation, the teacher's
   top-k, training and refit, all at the pair's vocabulary; no validation, a checkpoint at the
   last step. Every process of the run (the driver, each Ray actor, Ray's own) is polled every
   POLL_S seconds for its peak resident set (VmHWM, which is the peak since the process
   started, so polling misses no peak of a process that is still alive when polled). Ray
   actors are named by their class; the student's and the teacher's PolicyWorker by the calls
   seen in their process titles (train: the student; get_topk_logits: the teacher).
3. Seconds per step: the median of timing/train/total_step_time over the steps after the first
   (the first compiles and warms caches), and each phase's median beside it.
4. The trained wide student's extra ids: their total probability at every position of the
   held-out solutions and of the trained student's own samples (wide_vocab.extra_mass), from
   the last checkpoint.

Writes OUT/results.json and OUT/results.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import PeakMemory, fresh_run_dir, loop_records, run_meta, write_results  # noqa: E402

PHASES = ("generation", "teacher_topk", "logprob_check", "policy_training", "refit")


def run_pair(name: str, student: str, teacher: str, args: argparse.Namespace) -> dict:
    """The config for --steps steps with this pair; its timings and peak memory."""
    run_dir = fresh_run_dir(args.out / name)
    overrides = [
        f"policy.model_name={student}",
        f"teacher.model_name={teacher}",
        f"distillation.max_num_steps={args.steps}",
        "distillation.val_period=0",
        "distillation.val_at_start=false",
        "distillation.val_at_end=false",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"checkpointing.save_period={args.steps}",
        "checkpointing.metric_name=null",  # no validation to rank checkpoints by
        f"logger.log_dir={run_dir / 'logs'}",
        "policy.generation.backend=auto",  # vLLM where installed, as measured
        *args.overrides,
    ]
    command = [
        sys.executable, str(REPO / "examples" / "run_distillation_math.py"),
        "--config", args.config, *overrides,
    ]  # fmt: skip
    print(f"bench_wide_vocab: {name}: {' '.join(command[1:])}", flush=True)
    log = run_dir / "run.log"
    run_dir.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)
        memory = PeakMemory(process.pid)
        code = process.wait(timeout=args.timeout)
    wall = time.perf_counter() - start
    peaks = memory.stop()
    if code != 0:
        tail = log.read_text()[-3000:]
        raise SystemExit(f"bench_wide_vocab: the {name} run failed ({code}):\n{tail}")
    steps = _metrics(run_dir / "logs")
    totals = [m["timing/train/total_step_time"] for m in steps[1:]]
    phases = {
        p: statistics.median(m.get(f"timing/train/{p}", 0.0) for m in steps[1:]) for p in PHASES
    }
    return {
        "student": student,
        "teacher": teacher,
        "wall_s": round(wall, 1),
        "seconds_per_step": statistics.median(totals),
        "phase_seconds": phases,
        "peak_bytes": peaks,
        "final_checkpoint": str(run_dir / "checkpoints" / f"step_{args.steps}"),
    }


def _metrics(log_dir: Path) -> list[dict]:
    return [r for r in loop_records(log_dir) if "timing/train/total_step_time" in r]


def trained_extra_mass(checkpoint: Path, models: Path) -> dict:
    """The trained wide student's extra-id mass on held-out solutions and its own samples."""
    import torch
    from transformers import AutoTokenizer, Qwen3ForCausalLM

    from nemo_opd.tiny import wide_vocab
    from nemo_opd.tiny.assets import default_recipe, ensure_tiny_assets

    assets = ensure_tiny_assets(default_recipe())
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    policy_dir = next(p.parent for p in sorted(checkpoint.rglob("config.json")))
    model = Qwen3ForCausalLM.from_pretrained(policy_dir, dtype=torch.float32).eval()
    records = wide_vocab.read_jsonl(assets.validation_file)[: wide_vocab.CHECK_RECORDS]
    n_real = json.loads((models / "wide_vocab.json").read_text())["student"]["real_ids"]
    return wide_vocab.check_extra_mass(model, tokenizer, records, n_real, seed=1)


def report(results: dict) -> str:
    """The markdown table of the two runs."""
    tiny, wide = results["runs"]["tiny"], results["runs"]["wide"]
    lines = [
        "| | tiny pair (481 ids) | wide pair (151,936 ids) |",
        "|---|---|---|",
        f"| seconds per step (median) | {tiny['seconds_per_step']:.2f} | "
        f"{wide['seconds_per_step']:.2f} |",
    ]
    for phase in PHASES:
        lines.append(
            f"| - {phase} | {tiny['phase_seconds'][phase]:.3f} | "
            f"{wide['phase_seconds'][phase]:.3f} |"
        )
    lines.append(f"| whole command (s) | {tiny['wall_s']:.0f} | {wide['wall_s']:.0f} |")
    for name in sorted(set(tiny["peak_bytes"]) | set(wide["peak_bytes"]), key=_process_order):
        t, w = tiny["peak_bytes"].get(name), wide["peak_bytes"].get(name)
        lines.append(f"| peak RSS: {name} (GiB) | {_gib(t)} | {_gib(w)} |")
    mass = results["trained_student_extra_mass"]
    lines.append(
        f"\nTrained wide student, extra ids' total probability: at most "
        f"{mass['heldout_max_extra_mass']:.2g} over {mass['heldout_positions']:,} held-out "
        f"positions, {mass['samples_max_extra_mass']:.2g} over {mass['samples_positions']:,} "
        "positions of its own samples."
    )
    return "\n".join(lines)


def _process_order(name: str) -> tuple[int, str]:
    order = ("driver", "student", "teacher", "VllmWorker")
    return next((i for i, key in enumerate(order) if name.startswith(key)), len(order)), name


def _gib(value: int | None) -> str:
    return f"{value / 2**30:.2f}" if value is not None else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_wide_vocab"))
    parser.add_argument("--config", default="examples/configs/distillation_tiny.yaml")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per run (s)")
    parser.add_argument("overrides", nargs="*", help="more overrides for both runs")
    args = parser.parse_args()
    if args.steps < 2:
        raise SystemExit("bench_wide_vocab: --steps must be at least 2 (the first is warm-up)")
    args.out = args.out.absolute()
    models = args.out / "models"
    if not (models / "wide_vocab.json").is_file():
        build = [sys.executable, "-m", "nemo_opd.tiny.wide_vocab", "--out", str(models)]
        subprocess.run(build, check=True, cwd=REPO, env={**os.environ})
    built = json.loads((models / "wide_vocab.json").read_text())
    runs = {
        "tiny": run_pair("tiny", "tiny:student", "tiny:teacher", args),
        "wide": run_pair("wide", str(models / "student"), str(models / "teacher"), args),
    }
    results = {
        "meta": run_meta(),
        "steps": args.steps,
        "config": args.config,
        "overrides": args.overrides,
        "wide_models": built,
        "runs": runs,
        "trained_student_extra_mass": trained_extra_mass(
            Path(runs["wide"]["final_checkpoint"]), models
        ),
    }
    write_results(args.out, results, report(results))


if __name__ == "__main__":
    main()
