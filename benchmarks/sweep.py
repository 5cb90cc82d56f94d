"""Sweeps: configs, a grid of overrides and several seeds, run one after another.

    uv run --extra cpu python benchmarks/sweep.py --config examples/configs/opd_rl_tiny.yaml \\
        --grid policy.optimizer.lr=1e-4,3e-4,1e-3 loss_fn.ratio_clip_max=0.2,0.3 \\
        --seeds 42 1 2 --out runs/sweep_opd_rl

Several configs (`--config a.yaml b.yaml`) are one more axis of the grid: each config runs
every grid point (how the objectives are compared: docs/objectives.md).

Each run is a fresh process of examples/run_distillation_math.py with its grid point's
overrides (and --set's, for every run), distillation.seed, and checkpoints and logs of its own
under OUT/runs/<name>/. Its record (overrides, seed, exit status, wall time, the validation
accuracy at each validation step with the rollouts trained by then; final and best) is appended
to OUT/runs.jsonl as soon as it ends. A run already recorded with exit status 0 is not run
again, so an interrupted sweep resumes where it stopped (a failed run is run again).

Then OUT/sweep.md (per config and grid point, over seeds: mean, min and max of the final and
the best accuracy, mean wall time; with `--reach A`, the rollouts and seconds each needs to
first validate at accuracy A or more, the mean over seeds, or how many seeds never did; with
`--at-seconds T`, the mean accuracy of each run's last validation by T seconds) and
OUT/sweep.png (accuracy against rollouts and against wall time, the mean over seeds with their
range, one line per config and grid point). The accuracy is the loop's own
validation (`validation/accuracy`). A sweep tunes: with the embedded task (tiny_math) every run
trains on train without the development problems and validates on the development split
(`data.val_split=development`), never on the held-out problems the docs' tables report;
`--split held-out` measures chosen settings on the held-out split instead.
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

from harness import fresh_run_dir, loop_command, pyplot, run_meta, save_figure  # noqa: E402


def grid_points(grid: list[str]) -> list[tuple[str, ...]]:
    """The cartesian product of "key=v1,v2,..." axes, each point as overrides ("key=v1", ...)
    in the axes' order."""
    axes = []
    for axis in grid:
        key, sep, values = axis.partition("=")
        if not sep or not key or not values:
            raise SystemExit(f"sweep: a grid axis is key=v1,v2,... (got {axis!r})")
        axes.append([f"{key}={value}" for value in values.split(",")])
    return [tuple(point) for point in itertools.product(*axes)] if axes else [()]


def run_name(config: str, overrides: tuple[str, ...], seed: int) -> str:
    """A stable directory name for one run."""
    digest = hashlib.sha256("\n".join(overrides).encode()).hexdigest()[:10]
    return f"{Path(config).stem}-{digest}-seed{seed}"


def rollouts_per_step(config: str, overrides: list[str]) -> int:
    from nemo_opd.config import load_config

    loop = load_config(config, overrides).distillation
    return loop.num_prompts_per_step * loop.num_generations_per_prompt


def validation_points(log_dir: Path, per_step: int) -> list[dict]:
    """{"step", "rollouts", "elapsed_s", "accuracy"} of each validation the run logged.
    "rollouts" counts the rows trained by then: the steps' `rollout/samples` (a supervised or
    off-policy step trains each dataset response once, not per_step copies), per_step a step
    where a run did not log it."""
    from nemo_opd.utils.logger import read_jsonl

    metrics = log_dir / "metrics.jsonl"
    if not metrics.exists():
        return []
    points, trained = [], 0
    for record in read_jsonl(metrics):
        if record["step"] > 0:
            trained += int(record.get("rollout/samples", per_step))
        if "validation/accuracy" in record:
            points.append(
                {
                    "step": record["step"],
                    "rollouts": trained,
                    "elapsed_s": record.get("progress/elapsed_s"),
                    "accuracy": record["validation/accuracy"],
                }
            )
    return points


def run_one(
    args: argparse.Namespace, config: str, point: tuple[str, ...], seed: int, out: Path
) -> dict:
    """Run one config at one grid point and one seed; its record."""
    name = run_name(config, point, seed)
    run_dir = out / "runs" / name
    overrides = [*split_overrides(args.split), *args.set, *point, f"distillation.seed={seed}"]
    command = loop_command(config, fresh_run_dir(run_dir), overrides)
    started = time.time()
    with open(run_dir / "output.log", "w") as log:
        status = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    points = validation_points(run_dir / "logs", rollouts_per_step(config, overrides))
    accuracies = [p["accuracy"] for p in points]
    return {
        "name": name,
        "config": config,
        "overrides": list(point),
        "seed": seed,
        "split": args.split,
        "status": status.returncode,
        "wall_s": time.time() - started,
        "points": points,
        "final": accuracies[-1] if accuracies else None,
        "best": max(accuracies) if accuracies else None,
    }


def split_overrides(split: str) -> list[str]:
    """The overrides that validate on `split` ("development" or "held-out")."""
    return ["data.val_split=development"] if split == "development" else []


def read_records(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def sweep(args: argparse.Namespace) -> list[dict]:
    """Every (config, grid point, seed) not yet recorded with status 0, one after another; all
    the records of the sweep."""
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    journal = out / "runs.jsonl"
    splits = {r.get("split", "held-out") for r in read_records(journal)} - {args.split}
    if splits:
        raise SystemExit(
            f"sweep: {journal} holds runs validated on the {splits.pop()} split, not on "
            f"{args.split}: give this sweep another --out"
        )
    done = {run_key(r, args.config[0]) for r in read_records(journal) if r["status"] == 0}
    todo = [(c, p, s) for c in args.config for p in grid_points(args.grid) for s in args.seeds]
    for index, (config, point, seed) in enumerate(todo, start=1):
        label = label_of(config, point)
        if (config, point, seed) in done:
            print(f"[{index}/{len(todo)}] {label} seed={seed}: recorded, skipped", flush=True)
            continue
        print(f"[{index}/{len(todo)}] {label} seed={seed} ...", flush=True)
        record = run_one(args, config, point, seed, out)
        with open(journal, "a") as handle:
            handle.write(json.dumps(record) + "\n")
        shown = "-" if record["final"] is None else f"{record['final']:.1%}"
        best = "-" if record["best"] is None else f"{record['best']:.1%}"
        print(
            f"    exit {record['status']} in {record['wall_s']:.0f} s: final {shown}, best "
            f"{best} (output: {out / 'runs' / record['name'] / 'output.log'})",
            flush=True,
        )
    wanted = set(todo)
    latest = {}
    for record in read_records(journal):
        key = run_key(record, args.config[0])
        if key in wanted:
            latest[key] = record  # the last record of a run that was repeated
    return [latest[key] for key in todo if key in latest]


def run_key(record: dict, config: str) -> tuple[str, tuple[str, ...], int]:
    """(config, overrides, seed) of a record (one written before sweeps took several configs
    ran `config`)."""
    return record.get("config", config), tuple(record["overrides"]), record["seed"]


def label_of(config: str, point: tuple[str, ...]) -> str:
    return " ".join([Path(config).stem, *point])


def by_run(records: list[dict], config: str) -> dict[tuple[str, tuple[str, ...]], list[dict]]:
    """The finished records (status 0, validated) of each (config, grid point)."""
    groups: dict[tuple[str, tuple[str, ...]], list[dict]] = {}
    for record in records:
        if record["status"] == 0 and record["points"]:
            key = run_key(record, config)
            groups.setdefault(key[:2], []).append(record)
    return groups


def first_reaching(record: dict, accuracy: float) -> dict | None:
    """The first validation point of a run at `accuracy` or more, or None."""
    return next((p for p in record["points"] if p["accuracy"] >= accuracy - 1e-9), None)


def last_by(record: dict, seconds: float) -> dict | None:
    """The last validation point of a run at or before `seconds` since it started, or None."""
    points = [p for p in record["points"] if (p["elapsed_s"] or 0.0) <= seconds]
    return points[-1] if points else None


def summarize(
    records: list[dict], config: str, reach: float | None = None, at_seconds: float | None = None
) -> list[dict]:
    """Per (config, grid point) over its finished seeds: final and best accuracy (mean, min,
    max), mean wall time, seeds; with `reach`, the mean rollouts and seconds to first validate
    at that accuracy, over the seeds that did (and how many did); with `at_seconds`, the mean
    accuracy of the last validation by then (over the seeds that validated by then)."""
    rows = []
    for (run_config, point), runs in by_run(records, config).items():
        finals, bests = [r["final"] for r in runs], [r["best"] for r in runs]
        row = {
            "config": run_config,
            "overrides": list(point),
            "seeds": [r["seed"] for r in runs],
            "final": (statistics.mean(finals), min(finals), max(finals)),
            "best": (statistics.mean(bests), min(bests), max(bests)),
            "wall_s": statistics.mean(r["wall_s"] for r in runs),
        }
        if reach is not None:
            hits = [p for p in (first_reaching(r, reach) for r in runs) if p is not None]
            row["reach"] = {
                "accuracy": reach,
                "seeds_reached": len(hits),
                "rollouts": statistics.mean(p["rollouts"] for p in hits) if hits else None,
                "seconds": statistics.mean(p["elapsed_s"] or 0.0 for p in hits) if hits else None,
            }
        if at_seconds is not None:
            by_then = [p for p in (last_by(r, at_seconds) for r in runs) if p is not None]
            row["at_seconds"] = {
                "seconds": at_seconds,
                "accuracy": statistics.mean(p["accuracy"] for p in by_then) if by_then else None,
            }
        rows.append(row)
    return sorted(rows, key=lambda row: -row["final"][0])


def report(rows: list[dict], records: list[dict], out: Path, split: str) -> str:
    """The markdown table (best first), also written to OUT/sweep.md."""
    failed = [r for r in records if r["status"] != 0]
    reach = rows[0].get("reach") if rows else None
    at_seconds = rows[0].get("at_seconds") if rows else None
    header = "| run | seeds | final accuracy: mean (min-max) | best: mean (min-max) | wall |"
    rule = "|---|---|---|---|---|"
    if reach is not None:
        header += f" rollouts to {reach['accuracy']:.1%} | seconds to {reach['accuracy']:.1%} |"
        rule += "---|---|"
    if at_seconds is not None:
        header += f" accuracy by {at_seconds['seconds']:.0f} s |"
        rule += "---|"
    lines = [f"Validation accuracy on the {split} split.", "", header, rule]
    for row in rows:
        final, best = row["final"], row["best"]
        line = (
            f"| {label_of(row['config'], tuple(row['overrides']))} | {len(row['seeds'])} | "
            f"{final[0]:.1%} ({final[1]:.1%}-{final[2]:.1%}) | "
            f"{best[0]:.1%} ({best[1]:.1%}-{best[2]:.1%}) | {row['wall_s']:.0f} s |"
        )
        if reach is not None:
            line += reach_cells(row["reach"], len(row["seeds"]))
        if at_seconds is not None:
            accuracy = row["at_seconds"]["accuracy"]
            line += " - |" if accuracy is None else f" {accuracy:.1%} |"
        lines.append(line)
    if failed:
        names = ", ".join(
            f"{label_of(r.get('config', ''), tuple(r['overrides']))} seed={r['seed']}"
            for r in failed
        )
        lines += ["", f"failed (exit status not 0; run again by the next sweep): {names}"]
    text = "\n".join(lines)
    (out / "sweep.md").write_text(text + "\n")
    return text


def reach_cells(reach: dict, seeds: int) -> str:
    """The two --reach cells of a row: mean rollouts and seconds, and how many seeds never
    reached the accuracy."""
    if reach["rollouts"] is None:
        return " never | never |"
    missed = seeds - reach["seeds_reached"]
    note = f" ({missed} of {seeds} seeds never)" if missed else ""
    return f" {reach['rollouts']:,.0f}{note} | {reach['seconds']:.0f}{note} |"


def plot(records: list[dict], out: Path, config: str) -> Path:
    """Accuracy against rollouts and against wall time: per config and grid point the mean over
    seeds at each validation, and the range."""
    plt = pyplot()
    figure, (by_rollouts, by_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    for (run_config, point), runs in by_run(records, config).items():
        label = " ".join([Path(run_config).stem, *(o.split(".")[-1] for o in point)])
        length = min(len(r["points"]) for r in runs)
        at = [[r["points"][i] for r in runs] for i in range(length)]
        mean = [statistics.mean(p["accuracy"] for p in ps) for ps in at]
        low = [min(p["accuracy"] for p in ps) for ps in at]
        high = [max(p["accuracy"] for p in ps) for ps in at]
        rollouts = [ps[0]["rollouts"] for ps in at]
        seconds = [statistics.mean(p["elapsed_s"] or 0.0 for p in ps) for ps in at]
        for axes, xs in ((by_rollouts, rollouts), (by_time, seconds)):
            (line,) = axes.plot(xs, mean, marker="o", label=label)
            axes.fill_between(xs, low, high, color=line.get_color(), alpha=0.15)
    by_rollouts.set_xlabel("rollouts trained")
    by_time.set_xlabel("seconds since the run started")
    for axes in (by_rollouts, by_time):
        axes.set_ylabel("validation accuracy")
        axes.grid(alpha=0.3)
    by_rollouts.legend(fontsize=7, loc="lower right")
    return save_figure(figure, out / "sweep.png")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", nargs="+", required=True, help="one or more configs")
    parser.add_argument("--grid", nargs="*", default=[], help="key=v1,v2,... axes")
    parser.add_argument("--set", nargs="*", default=[], help="overrides for every run")
    parser.add_argument("--seeds", nargs="+", type=int, default=[42])
    parser.add_argument("--out", required=True)
    parser.add_argument(
        "--reach",
        type=float,
        help="an accuracy (0-1): the table also gives the rollouts and seconds to reach it",
    )
    parser.add_argument(
        "--at-seconds",
        type=float,
        help="seconds: the table also gives the accuracy of each run's last validation by then",
    )
    parser.add_argument(
        "--split",
        choices=("development", "held-out"),
        default="development",
        help="what the runs validate on: the tiny task's development split (tuning; the "
        "default) or the held-out split (measuring chosen settings)",
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    records = sweep(args)
    rows = summarize(records, args.config[0], args.reach, args.at_seconds)
    print(report(rows, records, out, args.split))
    print(f"plot: {plot(records, out, args.config[0])}")
    meta = {**run_meta(), "configs": args.config, "grid": args.grid, "set": args.set}
    meta["split"] = args.split
    (out / "sweep.json").write_text(json.dumps({"meta": meta, "summary": rows}, indent=2))


if __name__ == "__main__":
    main()
