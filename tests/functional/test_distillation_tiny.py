"""The whole loop on CPU: the tiny config with tensor parallelism 2, sequence packing and
two-turn rollouts (a retry after a wrong answer), interrupted by SIGKILL after a checkpoint and
resumed; the resumed run must end with the same metrics as an uninterrupted one.

The models are the seconds-long "micro" build of the tiny assets (the default tiny models take
minutes to build): this test checks the machinery, not the learning curve (docs/tiny_run.md
records that).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 4
COMPARED = (
    "train/loss",
    "train/forward_kl",
    "train/reverse_kl",
    "train/reward",
    "validation/accuracy",
    "validation/reverse_kl",
)


@pytest.fixture(scope="module")
def micro_assets():
    return ensure_tiny_assets(micro_recipe())


def overrides(assets, run_dir: Path) -> list[str]:
    return [
        f"policy.model_name={assets.student}",
        f"policy.tokenizer.name={assets.tokenizer}",
        f"teacher.model_name={assets.teacher}",
        f"teacher.tokenizer.name={assets.tokenizer}",
        f"distillation.max_num_steps={STEPS}",
        "distillation.num_prompts_per_step=8",
        "distillation.num_generations_per_prompt=2",
        "distillation.max_rollout_turns=2",
        "distillation.val_period=2",
        "distillation.max_val_samples=16",
        "distillation.val_batch_size=16",
        "env.math.retry_on_wrong=true",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.generation.max_new_tokens=12",
        "policy.generation.logprob_check_samples=5",  # of 16 rollouts per step
        "policy.dtensor_cfg.tensor_parallel_size=2",
        "policy.sequence_packing.enabled=true",
        "teacher.sequence_packing.enabled=true",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        "logger.rollout_dump_period=2",
    ]


def command(assets, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "examples" / "run_distillation_math.py"),
        "--config",
        str(ROOT / "examples" / "configs" / "distillation_tiny.yaml"),
        *overrides(assets, run_dir),
    ]


def run_to_end(assets, run_dir: Path) -> subprocess.CompletedProcess:
    result = subprocess.run(
        command(assets, run_dir), cwd=run_dir, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


def kill_after_checkpoint(assets, run_dir: Path, step: int) -> None:
    """Start a run and SIGKILL its whole process group once checkpoint `step` is complete."""
    marker = run_dir / "checkpoints" / f"step_{step}" / "training_state.json"
    process = subprocess.Popen(
        command(assets, run_dir),
        cwd=run_dir,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + 900
    while not marker.exists():
        assert process.poll() is None, "the run ended before it was interrupted"
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.2)
    os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def read_metrics(run_dir: Path) -> dict[int, dict]:
    lines = (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()
    by_step = {}
    for line in lines:
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    return by_step


def assert_exported_student_is_trained(final: Path, last_checkpoint: Path, initial: Path):
    """The exported student loads with from_pretrained, equals the last checkpoint's weights and
    differs from the initial student."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final)
    exported = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    saved = load_file(last_checkpoint / "model.safetensors")
    start = load_file(initial / "model.safetensors")
    for name, tensor in exported.items():
        assert torch.equal(tensor, saved[name].to(tensor.dtype)), name
    assert any(not torch.equal(exported[n], start[n].to(exported[n].dtype)) for n in start)


def test_tiny_distillation_runs_and_resumes(micro_assets, tmp_path):
    straight = tmp_path / "straight"
    straight.mkdir()
    result = run_to_end(micro_assets, straight)
    metrics = read_metrics(straight)

    # Every step logged once, with the loop's metrics.
    assert sorted(metrics) == list(range(STEPS + 1))  # step 0: validation at start
    for step in range(1, STEPS + 1):
        row = metrics[step]
        for key in (
            "train/loss",
            "train/forward_kl",
            "train/reverse_kl",
            "train/reward",
            "train/tokens_per_sec",
            "timing/train/total_step_time",
            "generation/logprob_mismatch",
            "rollout/mean_turns",
        ):
            assert key in row, f"step {step} lacks {key}"
        assert row["generation/logprob_mismatch"] < 1e-3  # fp32 vLLM == fp32 student
        assert 1.0 <= row["rollout/mean_turns"] <= 2.0
    assert metrics[STEPS]["rollout/mean_turns"] > 1.0 or metrics[1]["rollout/mean_turns"] > 1.0
    for step in (0, 2, 4):
        assert "validation/accuracy" in metrics[step]
        phases = ("generation", "teacher_topk", "student_eval")
        parts = [metrics[step][f"timing/validation/{phase}"] for phase in phases]
        assert 0 < sum(parts) <= metrics[step]["timing/validation"]
    assert (straight / "logs" / "rollouts" / "step_2.jsonl").exists()
    assert (straight / "logs" / "curves.png").stat().st_size > 0
    final = straight / "checkpoints" / "final_model"
    assert (final / "config.json").exists() and (final / "tokenizer.json").exists()
    assert_exported_student_is_trained(
        final, straight / "checkpoints" / f"step_{STEPS}" / "policy", micro_assets.student
    )
    print(result.stdout[-2000:])

    # SIGKILL after the step-2 checkpoint, run the same command again: same final metrics.
    resumed = tmp_path / "resumed"
    resumed.mkdir()
    kill_after_checkpoint(micro_assets, resumed, step=2)
    run_to_end(micro_assets, resumed)
    again = read_metrics(resumed)
    assert sorted(again) == sorted(metrics)
    for step in range(1, STEPS + 1):
        for key in COMPARED:
            if key in metrics[step]:
                assert again[step][key] == pytest.approx(metrics[step][key], rel=1e-4, abs=1e-6), (
                    f"step {step} {key}: resumed {again[step][key]} vs {metrics[step][key]}"
                )
