"""Plot logged metrics (metrics.jsonl) against the step, one subplot per metric.

Uses matplotlib's Figure with the Agg canvas directly rather than pyplot, so no display or
global backend state is touched (safe on headless nodes and inside a training process).
matplotlib is imported when a plot is drawn, not at start-up (its import is slow).
"""

from collections.abc import Sequence
from pathlib import Path

from nemo_opd.utils.checkpoint import atomic_file
from nemo_opd.utils.logger import read_jsonl

DEFAULT_KEYS = ("train/loss", "validation/accuracy")


def metric_series(records: Sequence[dict], key: str) -> tuple[list[int], list[float]]:
    """(steps, values) of `key` over the records that logged it with a number."""
    points = [
        (r["step"], float(r[key]))
        for r in records
        if isinstance(r.get(key), int | float) and isinstance(r.get("step"), int)
    ]
    return [step for step, _ in points], [value for _, value in points]


def plot_metrics(
    metrics_jsonl: str | Path,
    out_png: str | Path,
    keys: Sequence[str] = DEFAULT_KEYS,
) -> Path:
    """Plot each of `keys` found in metrics_jsonl into out_png (written atomically).

    Keys that were never logged are skipped; raises ValueError when the file holds no records
    or none of the keys.
    """
    records = read_jsonl(Path(metrics_jsonl))
    if not records:
        raise ValueError(f"{metrics_jsonl} holds no metrics records; nothing to plot")
    series = {key: metric_series(records, key) for key in keys}
    series = {key: points for key, points in series.items() if points[0]}
    if not series:
        logged = sorted({key for record in records for key in record} - {"step"})
        raise ValueError(
            f"none of {list(keys)} appear in {metrics_jsonl}; logged metrics: {logged}"
        )
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(7, 2.6 * len(series)), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(len(series), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (key, (steps, values)) in zip(axes, series.items(), strict=True):
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    out = Path(out_png)
    with atomic_file(out) as tmp:
        figure.savefig(tmp, format="png", dpi=100)
    return out
