"""benchmarks/sweep.py end to end: a grid of two learning rates, one seed, one-step runs of the
tiny config (real runs, each a fresh process, validating on the development split); then the
same sweep again, which runs nothing: every run is recorded. The table, the plot and the
journal hold both runs."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
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
        "--config", "examples/configs/distillation_tiny.yaml",
        "--grid", "policy.optimizer.lr=1e-3,3e-4", "--seeds", "7", "--out", str(out),
        "--set", *SHORT, *extra,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=REPO)


def test_a_sweep_runs_its_grid_once_and_resumes_without_running_again(tmp_path):
    first = _sweep(tmp_path)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["overrides"] for r in records] == [
        ["policy.optimizer.lr=1e-3"],
        ["policy.optimizer.lr=3e-4"],
    ]
    for record in records:
        assert record["status"] == 0 and record["seed"] == 7
        assert record["split"] == "development"  # tuning never validates on held-out
        config = json.loads(
            (tmp_path / "runs" / record["name"] / "logs" / "run_config.json").read_text()
        )
        assert config["data"]["val_split"] == "development"
        assert 0.0 <= record["final"] <= 1.0 and record["best"] == record["final"]
        assert record["points"][-1]["rollouts"] == 16  # 8 prompts x 2 samples, one step
    again = _sweep(tmp_path)
    assert again.returncode == 0 and again.stdout.count("recorded, skipped") == 2
    assert len((tmp_path / "runs.jsonl").read_text().splitlines()) == 2
    table = (tmp_path / "sweep.md").read_text()
    assert "policy.optimizer.lr=1e-3" in table and "policy.optimizer.lr=3e-4" in table
    assert (tmp_path / "sweep.png").stat().st_size > 0
    assert "development split" in table
    other = _sweep(tmp_path, "--split", "held-out")  # refused before running anything
    assert other.returncode != 0 and "another --out" in other.stderr
