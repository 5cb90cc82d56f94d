"""Plots of logged metrics (metrics.jsonl).

- plot_metrics: one run's curves against the step, one subplot per metric, with optional
  reference lines (the loop draws curves.png with it at the end of every run);
- plot_comparison: one metric of several runs on one figure against the rollouts they used;

    python -m nemo_opd.utils.plot compare OUT.png LABEL=RUN/logs/metrics.jsonl ... [--key K]

Uses matplotlib's Figure with the Agg canvas directly rather than pyplot, so no display or
global backend state is touched (safe on headless nodes and inside a training process).
matplotlib is imported when a plot is drawn, not at start-up (its import is slow).
"""

import argparse
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from nemo_opd.utils.checkpoint import atomic_file
from nemo_opd.utils.logger import read_jsonl

DEFAULT_KEYS = (
    "validation/accuracy",
    "train/reward",
    "validation/reverse_kl",
    "train/sampled_reverse_kl",
    "train/loss",
)
"""What a run's curves.png shows, where logged: held-out accuracy, the training reward, the
validation divergence to the teacher (top-k reverse KL), the sampled-token reverse KL of a
policy-gradient objective, and the objective's own loss."""
ROLLOUTS_KEY = "progress/rollouts"
"""Rollouts sampled for training up to a step (logged by the loop at every step)."""


def metric_series(records: Sequence[dict], key: str, x: str = "step") -> tuple[list, list]:
    """(x values, values) of `key` over the records that logged both with a number."""
    points = [
        (r[x], float(r[key]))
        for r in records
        if isinstance(r.get(key), int | float) and isinstance(r.get(x), int | float)
    ]
    return [at for at, _ in points], [value for _, value in points]


def plot_metrics(
    metrics_jsonl: str | Path,
    out_png: str | Path,
    keys: Sequence[str] = DEFAULT_KEYS,
    references: Mapping[str, tuple[str, float]] | None = None,
) -> Path:
    """Plot each of `keys` found in metrics_jsonl into out_png (written atomically), with a
    dashed horizontal line for each references[key] = (label, value).

    Keys that were never logged are skipped; raises ValueError when the file holds no records
    or none of the keys.
    """
    records = _records(metrics_jsonl)
    series = {key: metric_series(records, key) for key in keys}
    series = {key: points for key, points in series.items() if points[0]}
    if not series:
        logged = sorted({key for record in records for key in record} - {"step"})
        raise ValueError(
            f"none of {list(keys)} appear in {metrics_jsonl}; logged metrics: {logged}"
        )
    figure = _figure(len(series))
    axes = figure.subplots(len(series), 1, squeeze=False, sharex=True)[:, 0]
    for ax, (key, (steps, values)) in zip(axes, series.items(), strict=True):
        ax.plot(steps, values, marker="." if len(steps) < 50 else None)
        if references and key in references:
            label, value = references[key]
            ax.axhline(value, linestyle="--", color="gray", label=f"{label} ({value:.3g})")
            ax.legend(loc="best")
        ax.set_title(key)
        ax.grid(alpha=0.3)
    axes[-1].set_xlabel("step")
    return _save(figure, out_png)


def plot_comparison(
    runs: Mapping[str, str | Path],
    out_png: str | Path,
    key: str = "validation/accuracy",
    x: str = ROLLOUTS_KEY,
) -> Path:
    """One curve per run ({label: metrics.jsonl}) of `key` against `x` on one figure."""
    figure = _figure(1, width=7.5, height=4.5)
    ax = figure.subplots()
    for label, path in runs.items():
        xs, values = metric_series(_records(path), key, x)
        if not xs:
            raise ValueError(f"{path} has no records with both {key!r} and {x!r}")
        ax.plot(xs, values, marker=".", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(key)
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    return _save(figure, out_png)


def _records(metrics_jsonl: str | Path) -> list[dict]:
    records = read_jsonl(Path(metrics_jsonl))
    if not records:
        raise ValueError(f"{metrics_jsonl} holds no metrics records; nothing to plot")
    return records


def _figure(rows: int, width: float = 7.0, height: float = 2.6):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height * rows), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _save(figure, out_png: str | Path) -> Path:
    out = Path(out_png)
    with atomic_file(out) as tmp:
        figure.savefig(tmp, format="png", dpi=100)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_opd.utils.plot",
        description="Compare runs: one metric of several metrics.jsonl files on one figure.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    compare = commands.add_parser("compare", help="one metric of several runs against rollouts")
    compare.add_argument("out", help="the PNG to write")
    compare.add_argument("runs", nargs="+", help="LABEL=path/to/metrics.jsonl")
    compare.add_argument("--key", default="validation/accuracy", help="the metric to plot")
    compare.add_argument("--x", default=ROLLOUTS_KEY, help="the metric on the x axis")
    args = parser.parse_args(argv)
    runs = {}
    for item in args.runs:
        label, sep, path = item.partition("=")
        if not sep or not label or not path:
            parser.error(f"run {item!r} must be LABEL=path/to/metrics.jsonl")
        runs[label] = path
    try:
        out = plot_comparison(runs, args.out, key=args.key, x=args.x)
    except (OSError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
