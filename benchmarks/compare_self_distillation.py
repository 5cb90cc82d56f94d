"""Self-distillation on the tiny task: the teacher's sources side by side at equal rollouts.

    uv run --extra cpu python benchmarks/compare_self_distillation.py --out runs/compare_self
    uv run --extra cpu python benchmarks/compare_self_distillation.py --out runs/compare_self \\
        --arms live ema --seeds 42      # some of them, one seed

Every arm trains 100 steps of 64 rollouts (6,400) from the same student with the same
optimizer and schedule; the first four are examples/configs/distillation_tiny_self.yaml's
recipe (GRPO on the reward plus a sampled-token term toward the teacher, opd_grpo_tiny.yaml's,
run here for 100 steps where the shipped config runs 200) with another teacher, and the next two
the same objective with the frozen tiny teacher or no teacher term:

    ema         teacher.source ema, shown the answer: the shipped config
    live        teacher.source student: the student's live weights, shown the answer
    lagged      teacher.source lagged, a snapshot refreshed every 20 steps, shown the answer
    privileged  a frozen copy of the starting student (tiny:student, a second model of the
                same weights), shown the answer
    teacher     the frozen tiny teacher (tiny:teacher), no answer in view, at its own tuned
                term (opd_grpo_tiny.yaml)
    grpo        no teacher term: tuned GRPO alone (grpo_tiny.yaml)
    topk_ema    self-distillation alone, no reward: the top-k divergence toward the EMA shown
                the answer (distillation_tiny_100_lockstep.yaml's objective and batches)

Each arm is a sweep of its own (benchmarks/sweep.py: one fresh process per run, an interrupted
comparison resumes where it stopped) under OUT/<arm>/, validated on the 500 held-out problems
every 25 steps, checkpoints off. The runs go one after another, seed by seed (every arm at the
first seed, then at the next), so that a comparison cut short still has every arm. Then
OUT/results.md (also printed): held-out accuracy at each validation, the mean over the seeds
(min-max), one column per arm, and the mean wall time of a run; OUT/results.json holds every
run's points and where and when it ran.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import sweep  # noqa: E402
from harness import run_meta, write_results  # noqa: E402

CONFIGS = REPO / "examples" / "configs"
SELF = CONFIGS / "distillation_tiny_self.yaml"
SELF_OF_TINY = (
    "teacher.model_name=null",
    "~teacher.tokenizer",
    "teacher.source=ema",
    "teacher.ema_decay=0.9",
    "teacher.prompt_template='{prompt} {answer}'",
)
"""distillation_tiny_100_lockstep.yaml's frozen tiny teacher turned into the student's EMA."""
ARMS = {
    "ema": (SELF, ()),
    "live": (SELF, ("teacher.source=student",)),
    "lagged": (SELF, ("teacher.source=lagged", "teacher.refresh_steps=20")),
    "privileged": (
        SELF,
        (
            "teacher.source=model",
            "teacher.model_name=tiny:student",
            "+teacher.tokenizer.name=tiny:tokenizer",
        ),
    ),
    "teacher": (CONFIGS / "opd_grpo_tiny.yaml", ()),
    "grpo": (CONFIGS / "grpo_tiny.yaml", ()),
    "topk_ema": (CONFIGS / "distillation_tiny_100_lockstep.yaml", SELF_OF_TINY),
}
"""arm: (config, overrides). Every arm validates on the held-out split (sweep --split)."""
COMMON = (
    "distillation.max_num_steps=100",
    "distillation.val_period=25",
    "checkpointing.enabled=false",
)


def run_arm(arm: str, seeds: list[int], out: Path) -> list[dict]:
    """The arm's runs (sweep.sweep: those recorded already are not run again)."""
    config, overrides = ARMS[arm]
    args = argparse.Namespace(
        config=[str(config)],
        grid=[],
        set=[*COMMON, *overrides],
        seeds=seeds,
        out=str(out / arm),
        split="held-out",
    )
    return sweep.sweep(args)


def accuracy_by_step(records: list[dict]) -> dict[int, list[float]]:
    """{step: the held-out accuracy of each finished run at that validation}."""
    steps: dict[int, list[float]] = {}
    for record in records:
        if record["status"] != 0:
            continue
        for point in record["points"]:
            steps.setdefault(point["step"], []).append(point["accuracy"])
    return steps


def cell(values: list[float], seeds: int) -> str:
    """ "mean (min-max)" in percent; how many seeds when fewer than asked for."""
    if not values:
        return "-"
    mean = f"{100 * statistics.mean(values):.1f}"
    spread = f" ({100 * min(values):.1f}-{100 * max(values):.1f})" if len(values) > 1 else ""
    missing = f" [{len(values)} of {seeds} seeds]" if len(values) < seeds else ""
    return mean + spread + missing


def table(results: dict[str, list[dict]], seeds: int, per_step: int) -> str:
    """Held-out accuracy (%) by validation step, one column per arm; the mean wall time."""
    arms = list(results)
    by_arm = {arm: accuracy_by_step(records) for arm, records in results.items()}
    steps = sorted({step for steps in by_arm.values() for step in steps})
    lines = [
        "| step (rollouts) | " + " | ".join(arms) + " |",
        "|---:|" + "---:|" * len(arms),
    ]
    for step in steps:
        cells = [cell(by_arm[arm].get(step, []), seeds) for arm in arms]
        lines.append(f"| {step} ({step * per_step:,}) | " + " | ".join(cells) + " |")
    walls = [[r["wall_s"] for r in results[arm] if r["status"] == 0] for arm in arms]
    lines.append(
        "| wall time of a run | "
        + " | ".join(f"{statistics.mean(w):.0f} s" if w else "-" for w in walls)
        + " |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--arms", nargs="+", choices=list(ARMS), default=list(ARMS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[42, 1, 2])
    args = parser.parse_args()
    out = Path(args.out).resolve()
    for seed in args.seeds:  # every arm at one seed before the next seed
        for arm in args.arms:
            run_arm(arm, [seed], out)
    results = {arm: run_arm(arm, args.seeds, out) for arm in args.arms}  # all recorded now
    config, overrides = ARMS[args.arms[0]]
    per_step = sweep.rollouts_per_step(str(config), list(overrides))
    text = "Held-out accuracy (%), mean over the seeds (min-max):\n\n"
    text += table(results, len(args.seeds), per_step)
    meta = {**run_meta(), "arms": {arm: [str(c), list(o)] for arm, (c, o) in ARMS.items()}}
    write_results(out, {"meta": meta, "runs": results}, text)


if __name__ == "__main__":
    main()
