"""Overlap: the embedded default and its served-teacher config at distillation.max_staleness
0 (lockstep), 1 and 2, several seeds each, in one run.

    uv run --extra cpu python benchmarks/bench_overlap.py --out runs/bench_overlap \\
        [--staleness 0 1 2] [--seeds 42 43 44] [--configs tiny served] [OVERRIDE ...]

Each run is the README's command in a fresh process (the whole default: 100 steps, validation
at 0, 50 and 100). The served-teacher runs share one teacher server
(python -m nemo_opd.teacher_server with the served config), started here. Per run:

- seconds per step: the median of timing/train/total_step_time over the steps after the first
  (the loop's wall time per step: waiting for rollouts included, validation excluded);
- the whole command's wall time, and the final validation accuracy;
- where the time goes, medians over steps of each process's busy seconds per step: the
  trainer (total_step_time - rollout_wait), generation (refit + generation), the teacher
  (its one call per step, whatever it computed: TEACHER_PHASES), and the trainer's wait for
  rollouts.

Writes OUT/results.json and OUT/results.md and prints the tables.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import fresh_run_dir, loop_records, run_meta, write_results  # noqa: E402

CONFIGS = {
    "tiny": "examples/configs/distillation_tiny_100_lockstep.yaml",
    "served": "examples/configs/distillation_tiny_served_teacher.yaml",
}
TEACHER_PHASES = (
    "teacher_topk", "teacher_logprobs", "teacher_topk_logprobs", "teacher_hidden",
    "teacher_hidden_logprobs",
)  # fmt: skip
"""The teacher's call in a step, named by what it computed (step_rollouts.teacher_phase)."""
SERVER_START_TIMEOUT_S = 600.0
RUN_TIMEOUT_S = 3600.0


class TeacherServer:
    """The served config's teacher server on a free port, in its own process group."""

    def __init__(self, config: str, log: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        command = [sys.executable, "-m", "nemo_opd.teacher_server", "--config", config]
        self.log = open(log, "w")  # noqa: SIM115 (closed in stop)
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port)],
            cwd=REPO,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while "teacher server ready" not in log.read_text():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SystemExit(f"bench_overlap: the teacher server did not start; see {log}")
            time.sleep(1.0)
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
        self.log.close()


def run_one(name: str, staleness: int, seed: int, extra: list[str], args) -> dict:
    """One run of the config; its figures (see the module docstring)."""
    run_dir = fresh_run_dir(args.out / f"{name}_s{staleness}_seed{seed}")
    command = [
        sys.executable, "examples/run_distillation_math.py", "--config", CONFIGS[name],
        f"distillation.max_staleness={staleness}", f"distillation.seed={seed}",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}", "logger.console_progress=false", *extra,
        *args.overrides,
    ]  # fmt: skip
    print(f"bench_overlap: {name} staleness {staleness} seed {seed}", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(run_dir / "run.log", "w") as log:
        done = subprocess.run(
            command, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S
        )
    wall = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"bench_overlap: the run failed ({done.returncode}); see {run_dir}")
    records = loop_records(run_dir / "logs")
    steps = [r for r in records if "timing/train/total_step_time" in r][1:]
    accuracy = [r["validation/accuracy"] for r in records if "validation/accuracy" in r]
    figures = {
        "seconds_per_step": _median(steps, "timing/train/total_step_time"),
        "trainer_busy": _median(steps, "timing/train/total_step_time", "-rollout_wait"),
        "trainer_waiting": _median(steps, "timing/train/rollout_wait"),
        "generation_busy": _median(steps, "timing/train/refit", "timing/train/generation"),
        "teacher_busy": _median(steps, *(f"timing/train/{p}" for p in TEACHER_PHASES)),
    }
    print(f"  {figures['seconds_per_step']:.3f} s/step, {wall:.0f} s, acc {accuracy[-1]:.3f}")
    return {"wall_s": wall, "final_accuracy": accuracy[-1], **figures}


def _median(steps: list[dict], *keys: str) -> float:
    """The median over steps of the sum of `keys` ("-name": minus timing/train/name)."""

    def value(row: dict) -> float:
        total = 0.0
        for key in keys:
            if key.startswith("-"):
                total -= row.get(f"timing/train/{key[1:]}", 0.0)
            else:
                total += row.get(key, 0.0)
        return total

    return statistics.median(value(row) for row in steps)


def report(results: dict) -> str:
    """Markdown: per config and staleness, the means over seeds (and each seed's)."""
    lines = [
        "| config | max_staleness | s/step (mean over seeds) | vs lockstep | whole run (s) | "
        "final accuracy (each seed) |",
        "|---|---|---|---|---|---|",
    ]
    busy = [
        "| config | max_staleness | trainer busy | trainer waiting | generation busy | "
        "teacher busy | (s per step, medians, mean over seeds) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, by_staleness in results["runs"].items():
        base = None
        for staleness, runs in by_staleness.items():
            mean = {k: statistics.mean(r[k] for r in runs) for k in runs[0]}
            base = base or mean["seconds_per_step"]
            accuracies = ", ".join(f"{r['final_accuracy']:.3f}" for r in runs)
            lines.append(
                f"| {name} | {staleness} | {mean['seconds_per_step']:.3f} | "
                f"{mean['seconds_per_step'] / base:.2f}x | {mean['wall_s']:.0f} | "
                f"{mean['final_accuracy']:.3f} ({accuracies}) |"
            )
            busy.append(
                f"| {name} | {staleness} | {mean['trainer_busy']:.3f} | "
                f"{mean['trainer_waiting']:.3f} | {mean['generation_busy']:.3f} | "
                f"{mean['teacher_busy']:.3f} | |"
            )
    return "\n".join([*lines, "", *busy])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_overlap"))
    parser.add_argument("--staleness", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[42, 43, 44])
    parser.add_argument("--configs", nargs="+", choices=sorted(CONFIGS), default=list(CONFIGS))
    parser.add_argument("overrides", nargs="*", help="more overrides for every run")
    args = parser.parse_args()
    args.out = args.out.absolute()
    args.out.mkdir(parents=True, exist_ok=True)
    results = {"meta": run_meta(), "overrides": args.overrides, "runs": {}}
    for name in args.configs:
        server, extra = None, []
        if name == "served":
            server = TeacherServer(CONFIGS[name], args.out / "teacher_server.log")
            extra = [f"teacher.server.base_url={server.base_url}"]
        try:
            results["runs"][name] = {
                staleness: [run_one(name, staleness, seed, extra, args) for seed in args.seeds]
                for staleness in args.staleness
            }
        finally:
            if server is not None:
                server.stop()
    write_results(args.out, results, report(results))


if __name__ == "__main__":
    main()
