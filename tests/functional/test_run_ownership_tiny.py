"""A new user's second run, replayed: a run never resumes, exports over or logs into another
run's folders.

1. The tiny recipe runs 2 steps with checkpoints: its checkpoint records what made it, its final
   model is a marked export of step 2.
2. A config of the user's own, extending distillation_tiny.yaml with another student and a data
   file of their own (so inheriting the same folders), run with max_num_steps=20: exit status 2
   before Ray starts, within seconds, naming policy.model_name and data.train_path and the ways
   out; the first run's checkpoint, metrics, run_config.json and final model are untouched.
3. The first command again with max_num_steps=1: "nothing to do: step 2 >= 1", exit 0, nothing
   started and nothing exported again.
4. With the final model's marker gone (an export from before exports were marked): the run
   resumes step 2, trains nothing ("nothing to train") and exports step 2 over it.

Runs 2 and 3, which must end in seconds, are the command as its own process, timed from its
start as a user sees it; 1 and 4 run its main() in the test's process (run_configs.run_here),
sharing its imports.

Before: step 2 printed `resumed from .../step_2 (step 2)`, trained nothing, exported the first
run's weights again, wrote its own run_config.json beside the first run's metrics, exit 0.
"""

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import run_configs
from refused_runs import assert_shows_path
from short_runs import short_run_args

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "configs" / "distillation_tiny.yaml"
SCRIPT = ROOT / "examples" / "run_distillation_math.py"
CHECKPOINTS = (
    "checkpointing.enabled=true",
    "checkpointing.save_period=2",
    "checkpointing.metric_name=null",
)
SMALL_VALIDATION = ("distillation.val_at_end=true", "distillation.max_val_samples=8")


def args(config: Path, run_dir: Path, steps: int) -> list[str]:
    return short_run_args(config, run_dir, steps, *CHECKPOINTS, *SMALL_VALIDATION)


def command(config: Path, run_dir: Path, steps: int) -> list[str]:
    return [sys.executable, str(SCRIPT), *args(config, run_dir, steps)]


def run(config: Path, run_dir: Path, steps: int) -> tuple[subprocess.CompletedProcess, float]:
    """The command as its own process, as a user runs it (the runs that must end in seconds:
    timed from the interpreter's start)."""
    started = time.monotonic()
    result = subprocess.run(
        command(config, run_dir, steps), cwd=run_dir, capture_output=True, text=True, timeout=900
    )
    return result, time.monotonic() - started


def snapshot(run_dir: Path) -> dict[str, bytes]:
    """Every file of the run's folders (its lock file aside), by relative path."""
    return {
        str(path.relative_to(run_dir)): path.read_bytes()
        for path in sorted(run_dir.rglob("*"))
        if path.is_file() and path.name != ".nemo_opd.lock"
    }


def test_a_second_config_never_takes_the_first_runs_folders(tmp_path):
    run_dir = tmp_path / "runs"
    run_dir.mkdir()
    (out,) = run_configs.run_here([{"args": args(TINY, run_dir, 2)}])
    assert out.rstrip().endswith(" 0"), out[-3000:]
    checkpoint = json.loads(
        (run_dir / "checkpoints" / "step_2" / "training_state.json").read_text()
    )
    assert checkpoint["run"]["policy.model_name"] == {"policy.model_name": "tiny:student"}
    marker = json.loads(
        (run_dir / "checkpoints" / "final_model" / "nemo_opd_export.json").read_text()
    )
    assert marker["source"]["step"] == 2
    before = snapshot(run_dir)

    # The user's own config: another student and their own data, the recipe's folders.
    data = tmp_path / "train.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"{i} + 1 =", "answer": str(i + 1)}) + "\n" for i in range(50)
        )
    )
    mine = tmp_path / "my_run.yaml"
    mine.write_text(
        f"defaults: {TINY}\n"
        "policy:\n  model_name: tiny:teacher\n"
        f"data:\n  dataset_name: null\n  train_path: {data}\n  val_path: {data}\n"
    )
    second, seconds = run(mine, run_dir, 20)
    assert second.returncode == 2, second.stdout[-3000:] + second.stderr[-3000:]
    assert seconds < 10, seconds
    err = second.stderr
    assert f"error: checkpointing.checkpoint_dir {run_dir / 'checkpoints'} holds the " in err
    assert 'policy.model_name: "tiny:student" -> "tiny:teacher"' in err
    assert_shows_path(err, "data.train_path", data)
    assert "checkpointing.resume=force" in err
    assert "resumed from" not in second.stdout
    assert snapshot(run_dir) == before  # nothing of the first run changed

    third, seconds = run(TINY, run_dir, 1)
    assert third.returncode == 0, third.stdout[-3000:] + third.stderr[-3000:]
    assert seconds < 10, seconds
    assert "nothing to do: step 2 >= 1 (distillation.max_num_steps)" in third.stdout
    assert snapshot(run_dir) == before  # not exported again

    # 4. A final model exported before exports were marked, of another step than the newest
    # checkpoint (an interrupted export): the run resumes, trains nothing, exports that step.
    (run_dir / "checkpoints" / "final_model" / "nemo_opd_export.json").unlink()
    (out,) = run_configs.run_here([{"args": args(TINY, run_dir, 1)}])
    assert out.rstrip().endswith(" 0"), out[-3000:]
    assert f"resumed from {run_dir / 'checkpoints' / 'step_2'} (step 2)" in out
    assert "nothing to train: step 2 >= 1; exporting that step's model" in out
    marker = run_dir / "checkpoints" / "final_model" / "nemo_opd_export.json"
    assert json.loads(marker.read_text())["source"]["step"] == 2
    metrics = (run_dir / "logs" / "metrics.jsonl").read_bytes()
    assert metrics == before["logs/metrics.jsonl"]  # no step logged twice
