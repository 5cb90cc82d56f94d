"""Where a run's start-up goes, to its first trained step: wall time and CPU time per phase.

    uv run --extra cpu python benchmarks/profile_startup.py --out runs/profile_startup
    # other configs, overrides: --config CONFIG.yaml key=value ... (default: the tiny default)

Runs the loop in this process, as the README's command does (nemo_opd.cli), for one step
(`distillation.max_num_steps=1`, its outputs under --out), and notes at each point of its
start-up: the seconds since the process started (wall), the CPU seconds of the whole process
and those of its main thread. On a busy machine the wall time stretches with the load; the
main thread's CPU seconds hardly do, and on an idle machine they are the wall time of the
phases the main thread runs alone (imports, vLLM's start, rendering the prompts), so they are
what to compare across runs. The points:

- "loop imported": the loop's modules imported (torch, transformers, nemo_opd), setup begins;
- each start-up mark a run prints in its start-up report (nemo_opd.utils.startup), named by
  the part that noted it (setup, VllmWorker, PolicyWorker, HfWorker);
- the first validation's start and end, the first training step's start and end.

Writes OUT/startup.json and prints the table.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def process_cpu() -> float:
    """CPU seconds (user + system) of this process so far, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Marks:
    """(point, wall seconds since the process started, process CPU s, main-thread CPU s)."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.rows: list[tuple[str, float, float, float]] = []

    def note(self, point: str) -> None:
        """Record `point` now; main-thread CPU only when called from the main thread (the
        marks setup notes), else the last main-thread figure is repeated."""
        import threading

        main = self.rows[-1][3] if self.rows else 0.0
        if threading.current_thread() is threading.main_thread():
            main = time.thread_time()
        self.rows.append((point, time.time() - self.started, process_cpu(), main))


def format_table(rows: list[tuple[str, float, float, float]]) -> str:
    """The marks as a markdown table, each figure with its increase since the row before."""
    lines = [
        "| point | wall s | process CPU s | main thread CPU s |",
        "|---|---|---|---|",
    ]
    previous = (0.0, 0.0, 0.0)
    for point, *figures in rows:
        cells = [
            f"{now:.2f} (+{now - before:.2f})"
            for now, before in zip(figures, previous, strict=True)
        ]
        lines.append(f"| {point} | " + " | ".join(cells) + " |")
        previous = tuple(figures)
    return "\n".join(lines)


def hook(marks: Marks) -> None:
    """Note every start-up mark (each named by the class of the part that made it, or
    "setup"), the first validation and the first training step."""
    from nemo_opd.utils import startup

    noted_init, noted_note = startup.StartupMarks.__init__, startup.StartupMarks.note

    def init(self) -> None:
        noted_init(self)
        caller = sys._getframe(1).f_locals.get("self")
        self.profile_owner = type(caller).__name__ if caller is not None else "setup"
        if self.profile_owner == "setup" and not marks.rows[-1][0].startswith("setup"):
            marks.note("loop imported")  # setup's marks: the first of the run
            _hook_loop(marks)

    def note(self, name: str) -> None:
        marks.note(f"{getattr(self, 'profile_owner', 'setup')}: {name}")
        noted_note(self, name)

    startup.StartupMarks.__init__, startup.StartupMarks.note = init, note


def _hook_loop(marks: Marks) -> None:
    """Wrap the loop's validation and training step (called through its module's names)."""
    from nemo_opd.algorithms import distillation

    validate, train_step = distillation.validate, distillation._train_step
    seen: set[str] = set()

    def first(what: str, function):
        def wrapped(*args, **kwargs):
            once = what not in seen
            seen.add(what)
            if once:
                marks.note(f"first {what} begins")
            result = function(*args, **kwargs)
            if once:
                marks.note(f"first {what} ends")
            return result

        return wrapped

    distillation.validate = first("validation", validate)
    distillation._train_step = first("training step", train_step)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/configs/distillation_tiny.yaml")
    parser.add_argument("--out", default="runs/profile_startup")
    parser.add_argument("overrides", nargs="*", help="overrides of the config")
    args = parser.parse_args()
    from nemo_opd.utils.startup import process_start_time

    marks = Marks(process_start_time() or time.time())
    marks.note("profiler started")
    hook(marks)
    from nemo_opd.cli import main as run_command

    out = Path(args.out).resolve()
    if out.exists():
        raise SystemExit(f"{out} exists: give --out a folder that does not (the run starts fresh)")
    status = run_command(
        [
            "--config", args.config, *args.overrides, "distillation.max_num_steps=1",
            f"checkpointing.checkpoint_dir={out / 'checkpoints'}",
            f"logger.log_dir={out / 'logs'}",
        ]
    )  # fmt: skip
    marks.note("run ended")
    table = format_table(marks.rows)
    out.mkdir(parents=True, exist_ok=True)
    (out / "startup.json").write_text(json.dumps(marks.rows, indent=2) + "\n")
    print(table)
    raise SystemExit(status)


if __name__ == "__main__":
    main()
