"""Console output of a training run: a live progress bar and a per-step metric summary.

On a terminal (and when enabled) a rich progress bar tracks the steps and shows loss, KL and
reward live, with a one-row summary table printed above it after every step. Both fit the
terminal's width: the table keeps the columns that fit whole (the step, loss, held-out
accuracy and reward first, then the others in their order) and leaves the rest to
metrics.jsonl; the bar narrows and shows the live metrics that fit. Otherwise (logs redirected
to a file, CI, console_progress=false) every step prints one plain line, which stays readable
in a log file and is easy to grep.
"""

import math
import sys
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from rich import box
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

# (metric key, short label) shown in the per-step summary, in this order when present.
SUMMARY_KEYS: tuple[tuple[str, str], ...] = (
    ("train/loss", "loss"),
    ("train/forward_kl", "fwd_kl"),
    ("train/reverse_kl", "rev_kl"),
    ("train/reward", "reward"),
    ("validation/accuracy", "val_acc"),
    ("timing/train/total_step_time", "step_s"),
)
# Shown live next to the progress bar, in this order while they fit.
PROGRESS_KEYS: tuple[tuple[str, str], ...] = (
    SUMMARY_KEYS[0],
    SUMMARY_KEYS[3],
    SUMMARY_KEYS[1],
    SUMMARY_KEYS[2],
)
# Columns of the per-step table kept first when the terminal is too narrow for all of them.
FIRST_COLUMNS = ("loss", "val_acc", "reward")
BAR_PARTS_WIDTH = 34
"""Columns the progress line takes besides its bar and live metrics: "step", "350/350", the
elapsed and remaining times, and the spaces between them."""
BAR_WIDTHS = (10, 40)
"""The narrowest and widest progress bar."""
STATS_WIDTH = 50
"""Columns the live metrics take on a terminal wide enough for all of them."""
# Throughput metrics are recognised by suffix since several components report their own.
THROUGHPUT_SUFFIXES = ("tokens_per_sec", "tokens_per_second", "tokens/s")

PROMPT_CHARS = 160
RESPONSE_CHARS = 240


def format_value(value: float | None) -> str:
    """Compact number formatting: 4 significant digits, scientific for very large/small."""
    if value is None or not math.isfinite(value):
        return "nan"
    if value != 0 and (abs(value) >= 1e5 or abs(value) < 1e-3):
        return f"{value:.3e}"
    return f"{value:.4g}"


def select_summary(metrics: Mapping[str, float | None]) -> list[tuple[str, float | None]]:
    """The (label, value) pairs of the summary: fixed keys, per-phase timings, throughputs."""
    selected = [(label, metrics[key]) for key, label in SUMMARY_KEYS if key in metrics]
    for key, value in metrics.items():
        # Top-level phases of a training step only ("timing/train/<phase>"), not sub-phases.
        phase = key.removeprefix("timing/train/")
        is_phase = key.startswith("timing/train/") and "/" not in phase
        if is_phase and key != "timing/train/total_step_time":
            selected.append((f"{phase}_s", value))
        elif key.endswith(THROUGHPUT_SUFFIXES):
            name = key.replace("tokens_per_second", "tok/s").replace("tokens_per_sec", "tok/s")
            selected.append((name.removeprefix("train/"), value))
    return selected


def shorten(text: Any, limit: int, *, keep_end: bool = False) -> str:
    """One-line, at most `limit` characters; keep_end keeps the tail (a prompt's question)."""
    flat = " ".join(str(text).split())
    if len(flat) <= limit:
        return flat
    return "…" + flat[-(limit - 1) :] if keep_end else flat[: limit - 1] + "…"


class StepConsole:
    """Progress bar plus per-step summary on a terminal; one plain line per step otherwise."""

    def __init__(
        self,
        total_steps: int | None = None,
        *,
        progress: bool = True,
        start_step: int = 0,
        console: Console | None = None,
        file: TextIO | None = None,
    ) -> None:
        """total_steps: steps of the whole run (None: unknown); start_step: steps already done
        (on resume); file: where plain lines go (default: sys.stdout at print time)."""
        self.total_steps = total_steps
        self._file = file
        self._console = console or Console()
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._bar_width = 0
        if progress and self._console.is_terminal:
            self._start_progress(start_step)

    @property
    def live(self) -> bool:
        """Whether the rich progress display is active (False: plain lines)."""
        return self._progress is not None

    def _start_progress(self, start_step: int) -> None:
        """Start the live progress bar, already advanced to start_step; its bar as wide as
        the terminal leaves beside the other parts and the live metrics."""
        room = self._console.width - BAR_PARTS_WIDTH - STATS_WIDTH
        self._bar_width = min(max(room, BAR_WIDTHS[0]), BAR_WIDTHS[1])
        self._progress = Progress(
            TextColumn("[bold]step"),
            BarColumn(bar_width=self._bar_width),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[stats]}"),
            console=self._console,
        )
        self._task = self._progress.add_task("train", total=self.total_steps, stats="")
        self._progress.update(self._task, completed=start_step)
        self._progress.start()

    def update(self, step: int, metrics: Mapping[str, float | None]) -> None:
        """Report the finished `step` with its metrics."""
        summary = select_summary(metrics)
        if self._progress is None:
            self._print_line(self._step_label(step), summary)
            return
        self._progress.update(self._task, completed=step, stats=self._live_stats(metrics))
        if summary:
            self._progress.console.print(self._summary_table(step, summary))

    def _live_stats(self, metrics: Mapping[str, float | None]) -> str:
        """ "loss=0.12 reward=0.5 ...": PROGRESS_KEYS' metrics, in order, while they fit the
        room the progress line leaves."""
        room = self._console.width - BAR_PARTS_WIDTH - self._bar_width - 1
        parts: list[str] = []
        for key, label in PROGRESS_KEYS:
            if key in metrics:
                part = f"{label}={format_value(metrics[key])}"
                if len(" ".join([*parts, part])) > room:
                    break
                parts.append(part)
        return " ".join(parts)

    def print_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """Print sample rollouts (prompt tail, response head, reward), one line or row each."""
        if not records:
            return
        rows = [
            (
                format_value(_as_float(record.get("reward"))),
                shorten(record.get("prompt", ""), PROMPT_CHARS, keep_end=True),
                shorten(record.get("response", ""), RESPONSE_CHARS),
            )
            for record in records
        ]
        if self._progress is None:
            for index, (reward, prompt, response) in enumerate(rows):
                line = f"rollout {step}.{index} | reward {reward} | prompt: {prompt} | "
                print(line + f"response: {response}", file=self._file or sys.stdout, flush=True)
            return
        table = Table(title=f"sample rollouts, step {step}", box=box.SIMPLE, expand=True)
        table.add_column("reward", justify="right", no_wrap=True)
        table.add_column("prompt", ratio=2, overflow="fold")
        table.add_column("response", ratio=3, overflow="fold")
        for row in rows:
            table.add_row(*row)
        self._progress.console.print(table)

    def close(self) -> None:
        """Stop the live display (leaves the final bar on screen)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    def _step_label(self, step: int) -> str:
        """ "step 3/10", or "step 3" when the total is unknown."""
        return f"step {step}" + (f"/{self.total_steps}" if self.total_steps else "")

    def _print_line(self, head: str, summary: list[tuple[str, float | None]]) -> None:
        """The plain fallback: "step 3/10 | loss 0.12 | rev_kl 0.03 | ..." on one line."""
        parts = [head, *(f"{label} {format_value(value)}" for label, value in summary)]
        print(" | ".join(parts), file=self._file or sys.stdout, flush=True)

    def _summary_table(self, step: int, summary: list[tuple[str, float | None]]) -> Table:
        """One-row table: a column per selected metric that fits the terminal whole
        (fit_columns); every one is in metrics.jsonl."""
        cells = [("step", str(step))]
        cells += [(label, format_value(value)) for label, value in summary]
        cells = fit_columns(cells, self._console.width)
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1), show_edge=False)
        for index, (label, _) in enumerate(cells):
            table.add_column(label, justify="right", no_wrap=True, style="bold" * (index == 0))
        table.add_row(*(text for _, text in cells))
        return table


def fit_columns(cells: list[tuple[str, str]], width: int) -> list[tuple[str, str]]:
    """The (label, text) columns of a one-row table that fit `width` whole, in their order:
    the first (the step) always, then FIRST_COLUMNS, then each other that still fits. A
    column takes its longest text plus the space on each side and the rule between."""
    needed = [max(len(label), len(text)) + 3 for label, text in cells]
    order = [0] + [i for i, (label, _) in enumerate(cells) if label in FIRST_COLUMNS and i]
    order += [i for i in range(1, len(cells)) if i not in order]
    kept, used = [], 0
    for index in order:
        if used + needed[index] <= width or not kept:
            kept.append(index)
            used += needed[index]
    return [cells[index] for index in sorted(kept)]


def _as_float(value: Any) -> float | None:
    """A reward as a float, None when it is missing or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
