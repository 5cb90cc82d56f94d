"""The lines that end a run: its steps and wall time, the held-out accuracy at its first and
last validation (and the teacher's, where the run knows it), and where the final model,
metrics.jsonl and curves.png are. Each line fits an 80-column terminal but for long paths,
which are shown relative to the working directory when they are under it."""

import os
from dataclasses import dataclass
from pathlib import Path

from nemo_opd.utils.logger import read_jsonl

ACCURACY_KEY = "validation/accuracy"


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
    lines = [_steps_line(outcome), _accuracy_line(metrics, outcome.teacher_accuracy)]
    if outcome.final_model is not None:
        lines.append(f"final model:  {_shown(outcome.final_model)}")
    else:
        lines.append("final model:  not exported (the run stopped before its last step)")
    for label, path in (("metrics:", metrics), ("curves:", outcome.log_dir / "curves.png")):
        if path.is_file():
            lines.append(f"{label:<13} {_shown(path)}")
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


def _steps_line(outcome: RunOutcome) -> str:
    resumed = f", resumed from step {outcome.resumed_step}" if outcome.resumed_step else ""
    took = f"in {format_duration(outcome.seconds)}{resumed}"
    if outcome.final_model is None:
        return (
            f"run stopped after step {outcome.step} of {outcome.total_steps} {took}; the same "
            "command resumes it"
        )
    return f"run done: {outcome.step} of {outcome.total_steps} steps {took}"


def _accuracy_line(metrics: Path, teacher: tuple[float, str] | None) -> str:
    """'held-out accuracy: 34.2% (step 0) -> 60.6% (step 350); teacher 83.2% (...)'."""
    history = accuracy_history(metrics)
    if not history:
        measured = "not recorded (no validation in metrics.jsonl)"
    elif len(history) == 1:
        measured = f"{history[0][1]:.1%} (step {history[0][0]})"
    else:
        (first_step, first), (last_step, last) = history[0], history[-1]
        measured = f"{first:.1%} (step {first_step}) -> {last:.1%} (step {last_step})"
    if teacher is not None:
        measured += f"; teacher {teacher[0]:.1%} ({teacher[1]})"
    return f"held-out accuracy: {measured}"


def _shown(path: Path) -> str:
    """`path` relative to the working directory when it is under it, else as it is."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
