"""The tiny default in one process, in forked processes and on Ray: the executors are
interchangeable.

The shipped config has one worker, so auto runs it in the driver's process (the student, the
teacher and vLLM as objects there, no Ray started); cluster.executor=ray runs the same config as
Ray actors, and cluster.executor=processes as processes of this machine without Ray. At the
same seeds and thread counts (setup_workers.local_threads gives the process the threads each
Ray worker and engine computes on) all three log the same metrics, exactly, at every step:
overlap (each step's rollouts sampled while the step before trains), the refit check,
validation and checkpoints included. The run in one process is stopped by Ctrl-C (SIGINT to
its process group, as a terminal sends it) mid-run, checkpointing the step it stops after, and
resumed by the same command: the steps before the stop show the executors interchangeable, the
steps after it show the resumed run logging the uninterrupted run's metrics (those of the Ray
run, which the one-process run's must equal at every step).
"""

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import run_process
from run_metrics import read_metrics
from run_process import Run
from short_runs import GENERATION_AUTO

from nemo_opd.distributed.address import probe_head
from nemo_opd.errors import SetupError

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
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        GENERATION_AUTO,
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
    """The run in one process, stopped by Ctrl-C once step 1 is logged, then resumed by the
    same command to its end: its metrics (both parts'), the stopped run's exit status, stdout
    and stderr, and the resumed run's stdout."""
    run_dir = tmp_path_factory.mktemp("in_one_process")
    run = Run(command(run_dir), run_dir)
    # Once step 1 is logged: the stop lands in step 2 or 3, before the last (a Ctrl-C during
    # the last step lets it finish), however late a busy machine lets this process look.
    run.wait_for_step(1)
    os.killpg(run.process.pid, signal.SIGINT)  # its own session: the group is the run's
    code, out, err = run.finish()
    resumed = run_process.run_to_end(command(run_dir), run_dir) if code != 0 else None
    return {
        "metrics": read_metrics(run_dir),
        "stopped": (code, out, err),
        "resumed": resumed.stdout if resumed else "",
    }


def test_one_process_logs_the_ray_runs_metrics_exactly(on_ray, in_one_process):
    ray_metrics, ray_out = on_ray
    local_metrics = in_one_process["metrics"]
    _, local_out, _ = in_one_process["stopped"]
    assert "workers: one process (cluster.executor local, no Ray): the student, the " in local_out
    assert "ray: started a local instance" not in local_out
    assert "ray: started a local instance" in ray_out
    assert sorted(local_metrics) == sorted(ray_metrics) == list(range(STEPS + 1))
    assert "validation/accuracy" in local_metrics[STEPS]
    assert local_metrics[1]["generation/logprob_mismatch"] < 1e-3  # the refit holds
    assert compared(local_metrics) == compared(ray_metrics)


def test_the_ray_run_stops_the_ray_it_started(on_ray):
    """The command started a local Ray of its own (nothing to attach to): once it has ended,
    that instance's GCS no longer answers."""
    _, ray_out = on_ray
    address = re.search(r"ray: started a local instance at (\S+)", ray_out).group(1)
    with pytest.raises(SetupError, match="cannot reach a Ray head"):
        probe_head(address, timeout_s=5.0)


def test_forked_processes_log_the_ray_runs_metrics_exactly(on_ray, tmp_path):
    """cluster.executor=processes: the student, the teacher and vLLM each a process of this
    machine forked from one server, no Ray."""
    result = run_process.run_to_end(command(tmp_path, "cluster.executor=processes"), tmp_path)
    assert "(cluster.executor processes, no Ray)" in result.stdout
    assert "ray: started a local instance" not in result.stdout
    # The processes' own output (vLLM's warnings, weight loading) is in workers.log, not here.
    assert "Loading" not in result.stderr and "WARNING" not in result.stderr, result.stderr
    assert "Loading" in (tmp_path / "logs" / "workers.log").read_text()
    assert compared(read_metrics(tmp_path)) == compared(on_ray[0])


def test_ctrl_c_in_one_process_stops_cleanly_and_resumes_exactly(on_ray, in_one_process):
    """SIGTERM's clean stop is the fault chain's (test_distillation_tiny.py)."""
    code, out, err = in_one_process["stopped"]
    assert code == 128 + signal.SIGINT, err[-3000:]
    assert "SIGINT (Ctrl-C): the run stops after this step" in err and "Traceback" not in err
    assert "on SIGINT (Ctrl-C); run the same command to resume" in out
    stopped = int(re.search(r"stopped after step (\d+) on SIGINT", out).group(1))
    assert 1 <= stopped < STEPS, out[-3000:]
    resumed = in_one_process["resumed"]
    assert re.search(rf"resumed from \S+step_{stopped} \(step {stopped}\)", resumed), resumed
    straight = compared(on_ray[0])
    again = compared(in_one_process["metrics"])
    assert sorted(again) == sorted(straight)
    for step in range(stopped + 1, STEPS + 1):  # the steps the resumed run trained
        assert again[step] == straight[step], step
