"""benchmarks/sweep.py end to end: two configs at one grid point, one seed, one-step runs (real
runs, each a fresh process, validating on the development split); then the same sweep again,
which runs nothing: every run is recorded. The table, the plot and the journal hold both runs.
The grid and the table's arithmetic are checked on records written here."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

from sweep import grid_points, report, summarize  # noqa: E402

SHORT = [
    "distillation.max_num_steps=1", "distillation.num_prompts_per_step=8",
    "distillation.val_at_start=false", "distillation.val_at_end=true", "distillation.val_period=0",
    "distillation.max_val_samples=16", "distillation.val_batch_size=16",
    "policy.train_global_batch_size=16", "policy.train_micro_batch_size=8",
    "policy.generation.max_new_tokens=16", "checkpointing.enabled=false",
    "logger.console_progress=false",
]  # fmt: skip


def _sweep(out: Path, *extra: str) -> subprocess.CompletedProcess:
    command = [
        sys.executable, str(REPO / "benchmarks" / "sweep.py"),
        "--config", "examples/configs/distillation_tiny.yaml", "examples/configs/sft_tiny.yaml",
        "--grid", "policy.optimizer.lr=1e-3", "--seeds", "7", "--out", str(out),
        "--set", *SHORT, *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


@pytest.mark.slow  # two short runs of the tiny task: `pytest -m slow`
def test_a_sweep_runs_its_grid_once_and_resumes_without_running_again(tmp_path):
    first = _sweep(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [(Path(r["config"]).stem, r["overrides"]) for r in records] == [
        ("distillation_tiny", ["policy.optimizer.lr=1e-3"]),
        ("sft_tiny", ["policy.optimizer.lr=1e-3"]),
    ]
    for record in records:
        assert record["status"] == 0 and record["seed"] == 7
        assert record["split"] == "development"  # tuning never validates on held-out
        config = json.loads(
            (tmp_path / "runs" / record["name"] / "logs" / "run_config.json").read_text()
        )
        assert config["data"]["val_split"] == "development"
        assert 0.0 <= record["final"] <= 1.0 and record["best"] == record["final"]
    # rows trained: 8 prompts x 2 samples in one step; the supervised step trains each of its 8
    # reference solutions once
    assert [r["points"][-1]["rollouts"] for r in records] == [16, 8]
    again = _sweep(tmp_path)
    assert again.returncode == 0 and again.stdout.count("recorded, skipped") == 2
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    table = (tmp_path / "sweep.md").read_text()
    assert "distillation_tiny policy.optimizer.lr=1e-3" in table
    assert "sft_tiny policy.optimizer.lr=1e-3" in table
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "development split" in table
    other = _sweep(tmp_path, "--split", "held-out")  # refused before running anything
    assert other.returncode != 0 and "another --out" in other.stderr


def test_grid_points_are_the_cartesian_product_in_axis_order():
    assert grid_points(["a=1,2", "b=x,y"]) == [
        ("a=1", "b=x"), ("a=1", "b=y"), ("a=2", "b=x"), ("a=2", "b=y"),
    ]  # fmt: skip
    assert grid_points([]) == [()]


def _record(config, seed, accuracies, per_step=64, seconds_per_step=0.5):
    points = [
        {"step": s, "rollouts": s * per_step, "elapsed_s": s * seconds_per_step, "accuracy": a}
        for s, a in zip((0, 50, 100), accuracies, strict=True)
    ]
    return {
        "config": config, "overrides": [], "seed": seed, "status": 0, "wall_s": 60.0,
        "points": points, "final": accuracies[-1], "best": max(accuracies),
    }  # fmt: skip


def test_summary_and_rollouts_to_reach_an_accuracy(tmp_path):
    records = [
        _record("a.yaml", 1, [0.3, 0.5, 0.6]),
        _record("a.yaml", 2, [0.3, 0.4, 0.5]),
        _record("b.yaml", 1, [0.3, 0.35, 0.4]),
    ]
    rows = summarize(records, "a.yaml", reach=0.5)
    assert [row["config"] for row in rows] == ["a.yaml", "b.yaml"]  # best final first
    a, b = rows
    assert a["final"] == (0.55, 0.5, 0.6) and a["best"] == (0.55, 0.5, 0.6)
    # seed 1 reached 50% at step 50 (3,200 rollouts), seed 2 at step 100 (6,400)
    assert a["reach"] == {"accuracy": 0.5, "seeds_reached": 2, "rollouts": 4800, "seconds": 37.5}
    assert b["reach"]["seeds_reached"] == 0 and b["reach"]["rollouts"] is None
    table = report(rows, records, tmp_path, "held-out")
    assert "| a | 2 | 55.0% (50.0%-60.0%) |" in table and "4,800 | 38 |" in table
    assert "| b | 1 |" in table and "never | never |" in table
    by_30s = summarize(records, "a.yaml", at_seconds=30.0)  # steps 0 and 50 by then
    assert [row["at_seconds"]["accuracy"] for row in by_30s] == [0.45, 0.35]
    assert "accuracy by 30 s |" in report(by_30s, records, tmp_path, "held-out")
    one_missed = summarize(records[:2], "a.yaml", reach=0.6)[0]
    assert one_missed["reach"]["seeds_reached"] == 1
    assert "6,400 (1 of 2 seeds never)" in report([one_missed], records, tmp_path, "held-out")
