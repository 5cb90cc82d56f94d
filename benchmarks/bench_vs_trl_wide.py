"""nemo_opd beside TRL at a real width and vocabulary on CPU: seconds per step, sampled tokens
per second, and peak memory per process and in all.

    uv run --extra cpu --group bench python benchmarks/bench_vs_trl_wide.py \\
        --out runs/bench_vs_trl_wide [--rollouts 16] [--max-new-tokens 128] [--steps 4]

1. Builds the pair into OUT/models unless it is there: Qwen3's architecture at Qwen3-0.6B's
   width (hidden 1024, MLP 3072, 16 query heads of 128, 8 key-value heads, tied embeddings),
   Qwen3's 151,936-id vocabulary with Qwen3's real tokenizer and chat template
   (tests/real_tokenizers.py builds it from the packages that ship it: the dev group), random
   weights in float32; the student has --student-layers layers (2), the teacher
   --teacher-layers (4).
2. Every system gets the same work, read from one nemo_opd config (--config, the embedded
   default's, with the pair and the sizes below as overrides; TRL's side through
   bench_vs_trl.matched_settings, as in the tiny comparison): the tiny task's train prompts in
   Qwen3's chat template, --rollouts on-policy rollouts per step (one per prompt) of
   --max-new-tokens sampled tokens at temperature 1 (random weights never stop early), one
   optimizer step per step, the forward KL, --steps steps, no validation, no checkpoints.
3. Runs each system as a fresh process, one after the other: TRL's GKDTrainer and
   DistillationTrainer (bench_vs_trl.py trl: the speed settings of the tiny comparison,
   gradient checkpointing off, no saves), each in float32 and with bf16=True (autocast:
   bfloat16 compute over float32 weights); then nemo_opd in lockstep and with
   distillation.max_staleness=1 (the README's command with NEMO_OPD_SETTINGS: generation by the
   transformers backend from the student's own module, no refit check, bfloat16 compute over
   float32 weights, as the math recipe; the config's defaults otherwise: the LM head in chunks
   of policy.logits_chunk_tokens, the teacher's top-16), both again generating with vLLM in
   bfloat16 (VLLM), and both with every model in float32 (FLOAT32: the faster precision on a
   CPU without AMX, as TRL's float32 runs). TRL's best is its fastest of the
   four; the check asks one nemo_opd run to meet both targets. Every process of a
   run is polled for its peak resident set, and for the largest sum over all of them at once,
   resident (RSS) and proportional (PSS: shared pages such as Ray's object store counted once);
   a run whose processes together pass --memory-cap-gib (RSS) is killed and reported as not
   fitting.
4. Seconds per step: the median interval between step ends after the first step. Sampled
   tokens per step: counted (TRL: the new ids of its generate calls that are not padding;
   nemo_opd: rollout/samples x rollout/mean_generated_tokens). Tokens per second: their ratio.

Writes OUT/results.json and OUT/results.md and prints the table and the check: nemo_opd's best
one nemo_opd run with at least 2x the tokens per second of TRL's best and no more peak memory
in all than TRL's leanest run (or TRL does not fit under the cap where nemo_opd does), memory as
the peak PSS in all.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_engine import SHAPES  # noqa: E402
from bench_vs_trl import TRL_TRAINERS, matched_settings  # noqa: E402
from harness import PeakMemory, fresh_run_dir, loop_command, loop_records, run_meta, write_results  # noqa: E402

WIDTH = SHAPES["qwen3-0.6b"]
"""Qwen3-0.6B's width and vocabulary (its config.json), at fewer layers."""

NEMO_OPD_SETTINGS = [
    "policy.generation.backend=transformers",  # the tiny default's: the student's own module
    "policy.generation.logprob_check=false",
    "policy.generation.vllm_cfg.precision=bfloat16",
    "policy.precision=bfloat16",
    "teacher.precision=bfloat16",
    "policy.dynamic_batching.enabled=false",  # the fixed microbatches it was measured with
    "teacher.dynamic_batching.enabled=false",
]
"""nemo_opd's settings at this width, beyond the embedded default's: generation by the
transformers backend from the student's own module (lockstep: no engine copy of the weights,
no KV cache reserved ahead, no refit; under max_staleness 1 the engine keeps a copy of its own,
refit every step), no refit check (at this width a second forward of the student per step: +7 s
of ~50), and both models computing in bfloat16, the student's weights and Adam moments kept in
float32 (FSDP's mixed precision: the math recipe's `precision: bfloat16`). The `_vllm` runs
generate with vLLM instead, sampling in bfloat16 (6.6 s against 10.5 s in float32 on the 2-core
CPU of 2026-11-26)."""

FLOAT32 = [
    "policy.generation.vllm_cfg.precision=float32",
    "policy.precision=float32",
    "teacher.precision=float32",
]
"""Every model computing in float32, as TRL's float32 runs: on a CPU without AMX (bfloat16 matrix
products through AVX-512 only) float32 is the faster precision, as it is for TRL there."""

VLLM = "policy.generation.backend=auto"
"""vLLM where it is installed, the engine of the real recipes."""

NEMO_OPD = {
    "nemo_opd": ["distillation.max_staleness=0"],
    "nemo_opd_staleness1": ["distillation.max_staleness=1"],
    "nemo_opd_vllm": ["distillation.max_staleness=0", VLLM],
    "nemo_opd_vllm_staleness1": ["distillation.max_staleness=1", VLLM],
    "nemo_opd_fp32": ["distillation.max_staleness=0", *FLOAT32],
    "nemo_opd_fp32_staleness1": ["distillation.max_staleness=1", *FLOAT32],
}
"""nemo_opd's runs and their extra overrides (after NEMO_OPD_SETTINGS, so they win)."""

TRL_BF16 = "_bf16"
"""The suffix of a TRL run with `bf16=True` (autocast: bfloat16 compute, float32 weights and
Adam moments, nemo_opd's mixed precision); without it TRL computes in float32."""

LABELS = {
    "trl_gkd": "TRL GKDTrainer, float32",
    "trl_distillation": "TRL DistillationTrainer, float32",
    "trl_gkd_bf16": "TRL GKDTrainer, bf16=True",
    "trl_distillation_bf16": "TRL DistillationTrainer, bf16=True",
    "nemo_opd": "nemo_opd, lockstep",
    "nemo_opd_staleness1": "nemo_opd, max_staleness 1",
    "nemo_opd_vllm": "nemo_opd, vLLM, lockstep",
    "nemo_opd_vllm_staleness1": "nemo_opd, vLLM, max_staleness 1",
    "nemo_opd_fp32": "nemo_opd, float32, lockstep",
    "nemo_opd_fp32_staleness1": "nemo_opd, float32, max_staleness 1",
}

RATE_TARGET = 2.0
"""nemo_opd's tokens per second over TRL's best run's, at least."""
MEMORY_TARGET = 1.0
"""TRL's leanest run's peak PSS in all over nemo_opd's, at least (no more memory than it)."""


def build_pair(models: Path, student_layers: int, teacher_layers: int) -> dict[str, str]:
    """The student and the teacher (module docstring, 1.) under `models`; their paths."""
    paths = {"student": models / "student", "teacher": models / "teacher"}
    if all((path / "config.json").is_file() for path in paths.values()):
        return {name: str(path) for name, path in paths.items()}
    if importlib.util.find_spec("dashscope") is None:
        raise SystemExit("bench_vs_trl_wide needs Qwen3's tokenizer: uv sync --group dev")
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    sys.path.insert(0, str(REPO / "tests"))
    import real_tokenizers

    tokenizer = real_tokenizers.load("qwen3")
    for (name, path), layers in zip(paths.items(), (student_layers, teacher_layers), strict=True):
        print(f"bench_vs_trl_wide: building the {name} ({layers} layers) in {path}", flush=True)
        torch.manual_seed(len(name))
        config = Qwen3Config(
            **{**WIDTH, "num_hidden_layers": layers},
            bos_token_id=None,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        del model
    return {name: str(path) for name, path in paths.items()}


def overrides_for(pair: dict[str, str], args: argparse.Namespace) -> list[str]:
    """The config's overrides that give every system the same work (module docstring, 2.)."""
    rollouts = args.rollouts
    return [
        f"policy.model_name={pair['student']}",
        f"policy.tokenizer.name={pair['student']}",
        f"teacher.model_name={pair['teacher']}",
        f"teacher.tokenizer.name={pair['teacher']}",
        f"distillation.num_prompts_per_step={rollouts}",
        "distillation.num_generations_per_prompt=1",
        f"distillation.max_num_steps={args.steps}",
        "distillation.val_period=0",
        "distillation.val_at_start=false",
        "distillation.val_at_end=false",
        f"policy.train_global_batch_size={rollouts}",
        f"policy.train_micro_batch_size={rollouts}",
        f"policy.logprob_batch_size={rollouts}",
        f"teacher.logprob_batch_size={rollouts}",
        f"policy.generation.max_new_tokens={args.max_new_tokens}",
        f"policy.max_total_sequence_length={args.max_new_tokens + 64}",
        "policy.scheduler.name=constant",
        "checkpointing.enabled=false",
    ]


def watch(command: list[str], log: Path, cap_bytes: int, timeout: float) -> dict:
    """Run `command` (output in `log`) under PeakMemory; its wall time, exit and memory."""
    print(f"running: {' '.join(command)}\n  output: {log}", flush=True)
    start = time.perf_counter()
    with open(log, "w") as handle:
        process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
        memory = PeakMemory(process.pid, cap_bytes=cap_bytes)
        try:
            code = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            code = process.wait()
    peaks = memory.stop()
    wall = time.perf_counter() - start
    print(f"  exit {code} after {wall:.1f} s", flush=True)
    return {
        "wall_s": wall,
        "exit": code,
        "fits": not memory.capped,
        "peak_bytes": peaks,
        "peak_total_bytes": memory.peak_total,
        "peak_pss_bytes": memory.peak_pss,
    }


def steady(intervals: list[float], tokens: list[float]) -> dict:
    """Median seconds per step and tokens per step over the steps after the first."""
    if len(intervals) < 2:
        return {}
    seconds = statistics.median(intervals[1:])
    per_step = statistics.median(tokens[1:])
    return {
        "seconds_per_step": seconds,
        "sampled_tokens_per_step": per_step,
        "tokens_per_s": per_step / seconds,
    }


def run_trl(name: str, settings: dict, out: Path, args: argparse.Namespace) -> dict:
    """TRL's run `name` (trl_TRAINER, with TRL_BF16 for bf16=True) in a fresh process."""
    run_out = out / name
    run_out.mkdir(parents=True, exist_ok=True)
    bf16 = name.endswith(TRL_BF16)
    trainer = name.removeprefix("trl_").removesuffix(TRL_BF16)
    settings_file = run_out / "trl_settings.json"
    settings_file.write_text(json.dumps({**settings, "bf16": bf16}, indent=2))
    command = [
        sys.executable, str(REPO / "benchmarks" / "bench_vs_trl.py"), "trl",
        f"--trainer={trainer}", "--settings", str(settings_file), "--out", str(run_out),
        "--no-validate", "--no-save",
    ]  # fmt: skip
    result = watch(command, out / f"{name}.log", args.cap_bytes, args.timeout)
    timeline_file = run_out / "timeline.json"
    if result["exit"] == 0 and timeline_file.is_file():
        timeline = json.loads(timeline_file.read_text())
        ends = [timeline["train_begin"], *timeline["step_ends"]]
        intervals = [b - a for a, b in zip(ends, ends[1:], strict=False)]
        result.update(steady(intervals, timeline["sampled_tokens"]))
    return result


def run_nemo_opd(name: str, overrides: list[str], out: Path, args: argparse.Namespace) -> dict:
    run_dir = fresh_run_dir(out / name)
    ours = [*overrides, *NEMO_OPD_SETTINGS, *NEMO_OPD[name], *args.overrides]
    command = loop_command(args.config, run_dir, ours)
    result = watch(command, out / f"{name}.log", args.cap_bytes, args.timeout)
    if result["exit"] == 0:
        records = [r for r in loop_records(run_dir / "logs") if "rollout/samples" in r]
        start = records[0]["progress/elapsed_s"] - records[0]["timing/train/total_step_time"]
        elapsed = [start, *(r["progress/elapsed_s"] for r in records)]
        intervals = [b - a for a, b in zip(elapsed, elapsed[1:], strict=False)]
        tokens = [r["rollout/samples"] * r["rollout/mean_generated_tokens"] for r in records]
        result.update(steady(intervals, tokens))
        result["phase_seconds"] = {
            key.rsplit("/", 1)[1]: statistics.median(r[key] for r in records[1:])
            for key in records[-1]
            if key.startswith("timing/train/")
        }
    return result


def check(runs: dict) -> str:
    """The issue's check on the measured runs: one nemo_opd run meets both targets, its rate
    against TRL's fastest run and its memory against TRL's leanest."""
    trl = {name: run for name, run in runs.items() if name.startswith("trl_")}
    ours = {name: run for name, run in runs.items() if name.startswith("nemo_opd")}
    fitting_ours = {n: run for n, run in ours.items() if run["fits"] and "tokens_per_s" in run}
    if not fitting_ours:
        return "check: not met (no nemo_opd run finished)"
    if not trl:
        return "check: no TRL run to compare with"
    fitting_trl = [run for run in trl.values() if run["fits"] and "tokens_per_s" in run]
    if not fitting_trl:
        return "check: met (TRL does not fit under the cap where nemo_opd does)"
    best_rate = max(run["tokens_per_s"] for run in fitting_trl)
    least_trl = min(run["peak_pss_bytes"] for run in fitting_trl)
    ratios = {
        name: (run["tokens_per_s"] / best_rate, least_trl / run["peak_pss_bytes"])
        for name, run in fitting_ours.items()
    }
    meeting = [
        n for n, (rate, mem) in ratios.items() if rate >= RATE_TARGET and mem >= MEMORY_TARGET
    ]
    name = meeting[0] if meeting else max(ratios, key=lambda n: ratios[n][0])
    rate, memory = ratios[name]
    return (
        f"check: {'met' if meeting else 'not met'}: {LABELS[name]}: {rate:.2f}x the tokens per "
        f"second of TRL's best (target at least {RATE_TARGET:g}x), TRL's leanest peak memory in "
        f"all {memory:.2f}x its own (target at least {MEMORY_TARGET:g}x: no more memory)"
    )


def report(results: dict) -> str:
    runs = results["runs"]
    lines = [
        "| system | seconds per step | sampled tokens per step | tokens per second | peak "
        "memory in all, PSS (GiB) | in all, RSS (GiB) | largest process (GiB) | whole command "
        "(s) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, run in runs.items():
        largest = max(run["peak_bytes"].items(), key=lambda kv: kv[1], default=("-", 0))
        if not run["fits"]:
            cells = ["did not fit", "-", "-"]
        elif "tokens_per_s" not in run:
            cells = [f"failed (exit {run['exit']})", "-", "-"]
        else:
            cells = [
                f"{run['seconds_per_step']:.1f}",
                f"{run['sampled_tokens_per_step']:.0f}",
                f"{run['tokens_per_s']:.0f}",
            ]
        lines.append(
            f"| {LABELS[name]} | {' | '.join(cells)} | {run['peak_pss_bytes'] / 2**30:.2f} | "
            f"{run['peak_total_bytes'] / 2**30:.2f} | "
            f"{largest[1] / 2**30:.2f} ({largest[0]}) | {run['wall_s']:.0f} |"
        )
    lines += ["", check(runs)]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_vs_trl_wide"))
    parser.add_argument("--config", default="examples/configs/distillation_tiny.yaml")
    parser.add_argument("--rollouts", type=int, default=16, help="rollouts per step")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4, help="at least 3 (the first is warm-up)")
    parser.add_argument("--student-layers", type=int, default=2)
    parser.add_argument("--teacher-layers", type=int, default=4)
    parser.add_argument("--memory-cap-gib", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=3600.0, help="per run (s)")
    parser.add_argument(
        "--systems", nargs="+", default=list(LABELS), choices=list(LABELS), help="which to run"
    )
    parser.add_argument("overrides", nargs="*", help="more overrides of the config, for all")
    args = parser.parse_args()
    if args.steps < 3:
        raise SystemExit("bench_vs_trl_wide: --steps must be at least 3 (the first is warm-up)")
    args.cap_bytes = int(args.memory_cap_gib * 2**30)
    out = args.out.absolute()
    out.mkdir(parents=True, exist_ok=True)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    pair = build_pair(out / "models", args.student_layers, args.teacher_layers)
    overrides = overrides_for(pair, args)
    settings = matched_settings(args.config, [*overrides, *args.overrides])
    runs = {}
    for name in args.systems:
        if name.startswith("trl_"):
            runs[name] = run_trl(name, settings, out, args)
        else:
            runs[name] = run_nemo_opd(name, overrides, out, args)
        (out / "runs.json").write_text(json.dumps(runs, indent=2))  # kept if a later run fails
    results = {
        "meta": run_meta(),
        "width": WIDTH,
        "layers": {"student": args.student_layers, "teacher": args.teacher_layers},
        "rollouts_per_step": args.rollouts,
        "max_new_tokens": args.max_new_tokens,
        "steps": args.steps,
        "config": args.config,
        "overrides": [*overrides, *args.overrides],
        "nemo_opd_settings": NEMO_OPD_SETTINGS,
        "trl_trainers": TRL_TRAINERS,
        "runs": runs,
    }
    write_results(out, results, report(results))


if __name__ == "__main__":
    main()
