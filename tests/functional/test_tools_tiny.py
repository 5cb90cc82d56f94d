"""Tool turns in the whole loop on CPU (vLLM, Ray, DTensor, the tool worker process): the tiny
tool config with a student that calls the calculator (tiny:tools_teacher's weights, so that
calls happen from the first step), overlapped (distillation.max_staleness 1, so each checkpoint
holds the next step's conversations, tool turns and all). The uninterrupted run logs tool calls
and trains on the student's tokens only; a run whose training worker is killed after a
checkpoint ends with one message, and its resumption trains on the saved conversations and
logs the uninterrupted run's metrics.
"""

import json
import math
import os
import re
import signal
import sys
from pathlib import Path

import pytest
import run_process
from run_metrics import assert_resumed_like, read_metrics
from run_process import Run

from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import tools_recipe

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets(tools_recipe())


def command(assets, run_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "examples" / "run_distillation_math.py"),
        "--config",
        str(ROOT / "examples" / "configs" / "distillation_tiny_tools.yaml"),
        f"policy.model_name={assets.teacher}",  # a student that calls the calculator
        f"distillation.max_num_steps={STEPS}",
        "distillation.num_prompts_per_step=8",
        "distillation.num_generations_per_prompt=2",
        "distillation.val_period=0",
        "distillation.val_at_start=false",
        "distillation.val_at_end=false",
        "distillation.max_staleness=1",
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=8",
        "checkpointing.save_period=2",
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        "logger.rollout_dump_period=1",
        *extra,
    ]


@pytest.fixture(scope="module")
def straight(assets, tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("straight")
    run_process.run_to_end(command(assets, run_dir), run_dir)
    return run_dir, read_metrics(run_dir)


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


def test_a_killed_worker_resumes_exactly_mid_conversation(assets, straight, tmp_path):
    run = Run(command(assets, tmp_path), tmp_path)
    run.wait_for_checkpoint(2)
    victim = run.policy_workers()[0]
    os.kill(victim, signal.SIGKILL)
    code, _, err = run.finish()
    assert code == 1, err[-3000:]
    assert re.search(rf"error: .*\w+: worker rank \d died \(pid {victim}", err), err[-3000:]
    checkpoints = tmp_path / "checkpoints"
    newest = max(int(p.name.split("_")[1]) for p in checkpoints.glob("step_*"))
    if newest < STEPS:  # the next step's conversations, tool turns and all, saved with it
        assert (checkpoints / f"step_{newest}" / "rollouts_ahead.pt").is_file()
    out = run_process.run_to_end(command(assets, tmp_path), tmp_path).stdout
    assert f"resumed from {checkpoints / f'step_{newest}'}" in out
    assert "were not saved with the checkpoint" not in out
    resumed = read_metrics(tmp_path)
    assert_resumed_like(resumed, straight[1], range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in ("env/math/tool_calls", "env/math/tool_errors", "rollout/mean_turns"):
            assert resumed[step][key] == straight[1][step][key], (step, key)
