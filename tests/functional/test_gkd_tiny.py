"""The loop on off-policy data (the dataset's responses, data.response_key): GKD's lmbda mixing
and the supervised baseline, on the tiny task. The runs share this process's imports and Ray.

- lmbda 0.5: each step is on- or off-policy as the documented rule says (seed 42: off, on, on,
  off); off-policy steps train on the reference solutions (all correct: reward 1), skip the
  refit and the sampler check; on-policy steps sample as always.
- lmbda 0: its first step is the mixed run's first step exactly (both off-policy, from the
  same weights), and its data at step 4 (another off-policy step of the mixed run) is the same.
- objective.loss sft: no teacher starts; the NLL of the solutions falls.
"""

import json
from pathlib import Path

import pytest
import ray

from nemo_opd.algorithms.data_mix import is_on_policy_step
from nemo_opd.cli import main
from nemo_opd.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
STEPS = 4
DATA_METRICS = ("train/num_tokens", "train/reward", "rollout/mean_generated_tokens")


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def run_loop(run_dir: Path, config: str, *extra: str) -> dict[int, dict]:
    status = main(
        [
            "--config",
            str(CONFIGS / config),
            f"distillation.max_num_steps={STEPS}",
            "distillation.num_prompts_per_step=8",
            "distillation.num_generations_per_prompt=2",
            "distillation.val_at_start=false",
            "distillation.val_at_end=false",
            "distillation.val_period=0",
            "policy.train_global_batch_size=16",
            "policy.train_micro_batch_size=8",
            "policy.generation.max_new_tokens=16",
            "checkpointing.enabled=false",
            f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
            f"logger.log_dir={run_dir / 'logs'}",
            "logger.console_progress=false",
            *extra,
        ]
    )
    assert status == 0
    by_step = {}
    for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    return by_step


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    return run_loop(
        tmp_path_factory.mktemp("mixed"), "distillation_tiny.yaml", "distillation.lmbda=0.5"
    )


def test_each_step_is_on_or_off_policy_by_the_rule(mixed):
    cfg = load_config(CONFIGS / "distillation_tiny.yaml", ["distillation.lmbda=0.5"])
    kinds = [is_on_policy_step(cfg, step) for step in range(1, STEPS + 1)]
    assert kinds == [False, True, True, False]  # seed 42: both kinds, off first
    for step, on in enumerate(kinds, start=1):
        metrics = mixed[step]
        assert metrics["rollout/on_policy"] == float(on)
        assert ("generation/logprob_mismatch" in metrics) == on
        assert ("timing/train/refit" in metrics) == on
        if not on:  # the reference solutions: correct, and ended by EOS
            assert metrics["train/reward"] == 1.0
            assert metrics["rollout/natural_termination_rate"] == 1.0


def test_lmbda_0_is_the_mixed_runs_off_policy_steps(mixed, tmp_path):
    off = run_loop(tmp_path, "distillation_tiny.yaml", "distillation.lmbda=0")
    assert all(off[step]["rollout/on_policy"] == 0.0 for step in range(1, STEPS + 1))
    for key in ("train/loss", "train/forward_kl", "train/reverse_kl", *DATA_METRICS):
        assert off[1][key] == pytest.approx(mixed[1][key], rel=1e-6, abs=1e-9), key
    for key in DATA_METRICS:  # step 4: the same prompts and responses, other weights
        assert off[4][key] == mixed[4][key], key


def test_sft_trains_on_the_responses_without_a_teacher(tmp_path, capsys):
    sft = run_loop(tmp_path, "sft_tiny.yaml")
    out = capsys.readouterr().out
    assert "objective: supervised NLL of the dataset's responses (no teacher)" in out
    assert not any(key.startswith("timing/startup/teacher") for key in sft[1])
    assert all(sft[step]["rollout/on_policy"] == 0.0 for step in range(1, STEPS + 1))
    assert "train/forward_kl" not in sft[1] and sft[1]["train/reward"] == 1.0
    assert sft[STEPS]["train/loss"] < 0.8 * sft[1]["train/loss"]
