"""The lines that end a run: its steps and wall time, the held-out accuracy at its first and
last validation (and the teacher's, where the run knows it), and where the final model,
metrics.jsonl and curves.png are. Each line fits an 80-column terminal but for long paths,
which are shown relative to the working directory when they are under it."""

import os
from dataclasses import dataclass
from pathlib import Path

from nemo_opd.utils.logger import read_jsonl

ACCURACY_KEY = "validation/accuracy"
LABEL_WIDTH = 19
"""Columns of a line's label ("held-out accuracy: " and its space)."""


@dataclass(frozen=True)
class RunOutcome:
    """What a finished (or stopped) run reports."""

    step: int
    """The last step trained (of this run and the ones it resumed)."""
    total_steps: int
    resumed_step: int
    """The step this process resumed from (0: a fresh run)."""
    seconds: float
    """Wall time of this process."""
    log_dir: Path
    final_model: Path | None
    """The exported model; None when the run stopped before its end."""
    teacher_accuracy: tuple[float, str] | None = None
    """The teacher's held-out accuracy and where it comes from, when known."""


def format_run_summary(outcome: RunOutcome) -> str:
    """The summary lines (see the module docstring)."""
    metrics = outcome.log_dir / "metrics.jsonl"
    lines = [_steps_line(outcome), _line("held-out accuracy:", _accuracies(metrics))]
    if outcome.teacher_accuracy is not None:
        accuracy, source = outcome.teacher_accuracy
        lines.append(_line("teacher:", f"{accuracy:.1%} held-out ({source})"))
    if outcome.final_model is not None:
        lines.append(_line("final model:", _shown(outcome.final_model)))
    else:
        lines.append(_line("final model:", "not exported (the run stopped before its end)"))
    for label, path in (("metrics:", metrics), ("curves:", outcome.log_dir / "curves.png")):
        if path.is_file():
            lines.append(_line(label, _shown(path)))
    return "\n".join(lines)


def accuracy_history(metrics: Path) -> list[tuple[int, float]]:
    """(step, held-out accuracy) of every validation metrics.jsonl records, in step order."""
    if not metrics.is_file():
        return []
    records = read_jsonl(metrics)
    found = [(r.get("step"), r.get(ACCURACY_KEY)) for r in records]
    return sorted((s, a) for s, a in found if isinstance(s, int) and isinstance(a, int | float))


def format_duration(seconds: float) -> str:
    """'45 s', '3 min 21 s', '2 h 05 min'."""
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def _line(label: str, text: str) -> str:
    return f"{label:<{LABEL_WIDTH}}{text}"


def _steps_line(outcome: RunOutcome) -> str:
    resumed = f", resumed from step {outcome.resumed_step}" if outcome.resumed_step else ""
    took = f"in {format_duration(outcome.seconds)}{resumed}"
    if outcome.final_model is None:
        text = f"after step {outcome.step} of {outcome.total_steps} {took}"
        return _line("run stopped:", text + "; the same command resumes it")
    return _line("run done:", f"{outcome.step} of {outcome.total_steps} steps {took}")


def _accuracies(metrics: Path) -> str:
    """'34.2% (step 0) -> 60.6% (step 350)': the first and last validation's accuracy."""
    history = accuracy_history(metrics)
    if not history:
        return "not recorded (no validation in metrics.jsonl)"
    (first_step, first), (last_step, last) = history[0], history[-1]
    if len(history) == 1:
        return f"{first:.1%} (step {first_step})"
    return f"{first:.1%} (step {first_step}) -> {last:.1%} (step {last_step})"


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it, else as it is."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
