"""The tiny default in one process and on Ray: the executors are interchangeable.

The shipped config has one worker, so auto runs it in the driver's process (the student, the
teacher and vLLM as objects there, no Ray started); cluster.executor=ray runs the same config as
Ray actors. At the same seeds and thread counts (setup_workers.local_threads gives the process the
threads each Ray worker and engine computes on) both log the same metrics, exactly, at every
step: overlap (each step's rollouts sampled while the step before trains), the refit check,
validation and checkpoints included. Then the run in one process stopped by SIGTERM after a
checkpoint, and resumed by the same command, logs the uninterrupted run's metrics.
"""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import run_process
from run_metrics import read_metrics
from run_process import Run

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
COMPARED_PREFIXES = ("train/", "validation/", "generation/logprob_mismatch", "rollout/")
NOT_COMPARED = ("train/tokens_per_sec",)


def command(run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "examples" / "run_distillation_math.py"),
        "--config",
        str(ROOT / "examples" / "configs" / "distillation_tiny.yaml"),
        f"distillation.max_num_steps={STEPS}",
        "distillation.val_period=2",
        "distillation.max_val_samples=64",
        "distillation.val_batch_size=64",
        "policy.generation.logprob_check_period=3",  # steps 1 and 4 checked, 2 and 3 overlap
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        *extra,
    ]


def compared(metrics: dict[int, dict]) -> dict[int, dict]:
    """The metrics a run computes (not its timings), by step."""
    return {
        step: {
            key: value
            for key, value in row.items()
            if key.startswith(COMPARED_PREFIXES) and key not in NOT_COMPARED
        }
        for step, row in metrics.items()
    }


@pytest.fixture(scope="module")
def on_ray(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("on_ray")
    result = run_process.run_to_end(command(run_dir, "cluster.executor=ray"), run_dir)
    return read_metrics(run_dir), result.stdout


@pytest.fixture(scope="module")
def in_one_process(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("in_one_process")
    result = run_process.run_to_end(command(run_dir), run_dir)
    return read_metrics(run_dir), result.stdout


def test_one_process_logs_the_ray_runs_metrics_exactly(on_ray, in_one_process):
    ray_metrics, ray_out = on_ray
    local_metrics, local_out = in_one_process
    assert "workers: one process (cluster.executor local, no Ray): the student, the " in local_out
    assert "ray: started a local instance" not in local_out
    assert "ray: started a local instance" in ray_out
    assert sorted(local_metrics) == sorted(ray_metrics) == list(range(STEPS + 1))
    assert "validation/accuracy" in local_metrics[STEPS]
    assert local_metrics[1]["generation/logprob_mismatch"] < 1e-3  # the refit holds
    assert compared(local_metrics) == compared(ray_metrics)


def test_sigterm_in_one_process_stops_cleanly_and_resumes_exactly(in_one_process, tmp_path):
    run = Run(command(tmp_path, "checkpointing.metric_name=null"), tmp_path)
    run.wait_for_checkpoint(2)
    os.kill(run.process.pid, signal.SIGTERM)
    code, out, err = run.finish()
    assert code == 128 + signal.SIGTERM, err[-3000:]
    assert "on SIGTERM; run the same command to resume" in out
    resumed = subprocess.run(
        command(tmp_path, "checkpointing.metric_name=null"),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    straight = compared(in_one_process[0])
    again = compared(read_metrics(tmp_path))
    assert sorted(again) == sorted(straight)
    for step in (3, 4):  # the steps the resumed run trained
        assert again[step] == straight[step], step
