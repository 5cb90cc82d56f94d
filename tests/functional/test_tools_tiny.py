"""Tool turns in the whole loop on CPU (vLLM, DTensor, the tool worker process): the tiny
tool config with a student that calls the calculator (tiny:tools_teacher's weights, so that
calls happen from the first step), overlapped (distillation.max_staleness 1, so each checkpoint
holds the next step's conversations, tool turns and all). The uninterrupted run logs tool calls
and trains on the student's tokens only; a second run, started from a copy of its step-1
checkpoint in a fresh run directory, trains on the saved conversations and logs the
uninterrupted run's metrics.

Both runs share this driver process (one import; with one worker each runs there, on the
local executor, and starts and stops its own engines and its own tool worker process). A
training worker killed mid-run is not repeated here: tests/functional/test_distillation_tiny.py::
test_faults_end_runs_cleanly_and_resume_exactly kills one with rollouts ahead and resumes;
what is particular to tools, conversations with tool turns saved with a checkpoint
and trained on after resuming, is what this module checks.
"""

import json
import math
import shutil
from pathlib import Path

import pytest
from run_metrics import assert_resumed_like, read_metrics
from short_runs import short_run_args

from nemo_opd.cli import main
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import tools_recipe

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "distillation_tiny_tools.yaml"
STEPS = 3
RESUME_FROM = 1
ROLLOUT_METRICS = (
    "env/math/tool_calls",
    "env/math/tool_errors",
    "rollout/mean_turns",
    "rollout/weights_version",
)


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets(tools_recipe())


def run_loop(assets, run_dir: Path) -> dict[int, dict]:
    status = main(
        short_run_args(
            CONFIG,
            run_dir,
            STEPS,
            f"policy.model_name={assets.teacher}",  # a student that calls the calculator
            "policy.generation.max_new_tokens=40",  # the config's: a call or an answer fits
            "distillation.max_staleness=1",
            "checkpointing.enabled=true",
            "checkpointing.save_period=1",
            "checkpointing.keep_top_k=null",
            "checkpointing.metric_name=null",
            "logger.rollout_dump_period=1",
        )
    )
    assert status == 0
    return read_metrics(run_dir)


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    return run_dir, run_loop(assets, run_dir)


def test_tool_turns_run_through_the_loop(straight):
    run_dir, metrics = straight
    assert sorted(metrics) == list(range(1, STEPS + 1))
    calls = sum(metrics[step]["env/math/tool_calls"] for step in metrics)
    assert calls > 0
    for step in metrics:
        row = metrics[step]
        assert row["env/math/tool_errors"] <= row["env/math/tool_calls"]
        assert 1.0 <= row["rollout/mean_turns"] <= 3.0
        assert math.isfinite(row["train/loss"])
    records = [json.loads(line) for line in (run_dir / "logs" / "rollouts" / "step_1.jsonl").open()]
    with_tools = [r for r in records if any(m["role"] == "tool" for m in r["messages"])]
    assert with_tools
    for record in with_tools:
        roles = [m["role"] for m in record["messages"]]
        assert roles[roles.index("tool") - 1] == "assistant"
        assert "<tool_call>" in record["messages"][roles.index("tool") - 1]["content"]


def test_resuming_mid_conversation_is_exact(assets, straight, tmp_path, capsys):
    source = straight[0] / "checkpoints" / f"step_{RESUME_FROM}"
    # The next step's conversations, tool turns and all, saved with the checkpoint.
    assert (source / "rollouts_ahead.pt").is_file()
    seeded = tmp_path / "checkpoints" / f"step_{RESUME_FROM}"
    shutil.copytree(source, seeded)
    capsys.readouterr()
    resumed = run_loop(assets, tmp_path)
    out = capsys.readouterr().out
    assert f"resumed from {seeded} (step {RESUME_FROM})" in out, out[-3000:]
    assert "were not saved with the checkpoint" not in out
    steps = range(RESUME_FROM + 1, STEPS + 1)
    assert sorted(resumed) == list(steps)
    assert_resumed_like(resumed, {step: straight[1][step] for step in steps}, steps)
    # The first resumed step trains on the saved conversations, sampled by the initial weights.
    assert resumed[RESUME_FROM + 1]["rollout/weights_version"] == 0
    for step in steps:
        for key in ROLLOUT_METRICS:
            assert resumed[step][key] == straight[1][step][key], (step, key)
    assert sum(resumed[step]["env/math/tool_calls"] for step in steps) > 0
