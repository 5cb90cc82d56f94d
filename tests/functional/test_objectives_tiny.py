"""The three reinforcement-learning configs on CPU, a few steps each, in this process (the
local executor: each run builds and stops its own student, teacher and engine, and they share
the process's imports):

- grpo_tiny.yaml: reward only; no teacher is configured, and none is started;
- opd_grpo_tiny.yaml: GRPO plus the sampled-token reverse-KL term (slime), here with the top-k
  term added too, so the teacher computes both of its outputs;
- opd_rl_tiny.yaml: the sampled reverse KL alone (tinker-cookbook), run straight through, then
  resumed from its first step's checkpoint (copied into a fresh run directory): the resumed
  steps must log the straight run's metrics.

The models are the micro build of the tiny assets (seconds to build): the machinery is what is
tested here; docs/objectives.md records the learning curves of the full configs.
"""

from pathlib import Path

import pytest
import run_configs
from run_metrics import read_metrics

from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
STEPS = 3
PG_METRICS = (
    "train/loss",
    "train/pg_loss",
    "train/clip_fraction",
    "train/ratio_mean",
    "train/ratio_min",
    "train/ratio_max",
    "train/advantage_mean",
    "train/advantage_std",
    "train/reward",
)


def common(assets, run_dir: Path) -> list[str]:
    return [
        f"policy.model_name={assets.student}",
        f"policy.tokenizer.name={assets.tokenizer}",
        "data.dataset_name=null",
        f"data.train_path={assets.train_file}",
        f"data.val_path={assets.validation_file}",
        f"distillation.max_num_steps={STEPS}",
        "distillation.num_prompts_per_step=4",
        "distillation.num_generations_per_prompt=4",
        "distillation.val_period=0",
        "distillation.val_at_start=false",
        "distillation.val_at_end=true",
        "distillation.max_val_samples=8",
        "distillation.val_batch_size=16",
        "policy.train_global_batch_size=8",  # two optimizer steps per step: ratios move
        "policy.train_micro_batch_size=4",
        "policy.generation.max_new_tokens=12",
        "policy.scheduler.name=constant",
        "checkpointing.save_period=1",
        "checkpointing.keep_top_k=null",
        "checkpointing.metric_name=null",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
    ]


def with_teacher(assets) -> list[str]:
    return [f"teacher.model_name={assets.teacher}", f"teacher.tokenizer.name={assets.tokenizer}"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Run every config once, and opd_rl once more from its step-1 checkpoint, in this process
    (four runs: each builds and stops its own workers, and they share the rest)."""
    assets = ensure_tiny_assets(micro_recipe())
    root = tmp_path_factory.mktemp("objectives")
    dirs = {name: root / name for name in ("grpo", "opd_grpo", "opd_rl", "opd_rl_resumed")}
    plan = [
        ("grpo", "grpo_tiny.yaml", ["distillation.val_samples_per_prompt=2"]),
        ("opd_grpo", "opd_grpo_tiny.yaml", [*with_teacher(assets), "objective.topk_kl_coef=0.1"]),
        ("opd_rl", "opd_rl_tiny.yaml", with_teacher(assets)),
        ("opd_rl_resumed", "opd_rl_tiny.yaml", with_teacher(assets)),
    ]
    spec = []
    for name, config, extra in plan:
        args = ["--config", str(CONFIGS / config), *common(assets, dirs[name]), *extra]
        seed = None
        if name == "opd_rl_resumed":
            source = dirs["opd_rl"] / "checkpoints" / "step_1"
            seed = [str(source), str(dirs[name] / "checkpoints" / "step_1")]
        spec.append({"args": args, "seed_checkpoint": seed})
    output = run_configs.run_here(spec)
    assert len(output) == len(plan)
    return dirs, output


def test_grpo_runs_without_a_teacher(runs):
    dirs, output = runs
    assert output[0].rstrip().endswith("exit 0 0"), output[0][-3000:]
    assert "policy gradient over advantages 1.0 x reward (grpo)" in output[0]
    temperatures = next(line for line in output[0].splitlines() if line.startswith("temperat"))
    assert "teacher" not in temperatures
    metrics = read_metrics(dirs["grpo"])
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        row = metrics[step]
        for key in PG_METRICS:
            assert key in row, f"step {step} lacks {key}"
        assert not any(key.startswith("timing/train/teacher") for key in row)
        assert "train/sampled_reverse_kl" not in row and "train/opd_term_mean" not in row
        # The reward alone makes the advantages; GRPO centres each prompt's group at 0.
        assert row["train/advantage_mean"] == pytest.approx(row["train/reward_term_mean"])
        assert abs(row["train/reward_advantage_mean"]) < 1e-6
        assert (16 * row["train/reward"]).is_integer()  # 4 prompts x 4 samples, reward 0 or 1
        assert row["train/loss"] == row["train/pg_loss"]  # no top-k term
    last = metrics[STEPS]
    assert "validation/accuracy" in last and "validation/reverse_kl" not in last
    assert 0 <= last["validation/accuracy_avg@2"] <= last["validation/pass@2"] <= 1
    # The second optimizer step of each step trains on rollouts of the policy before the first.
    assert any(metrics[s]["train/ratio_max"] != 1.0 for s in metrics)
    assert (dirs["grpo"] / "logs" / "curves.png").stat().st_size > 0


def test_grpo_plus_opd_uses_both_teacher_outputs(runs):
    dirs, output = runs
    assert output[1].rstrip().endswith("exit 1 0"), output[1][-3000:]
    metrics = read_metrics(dirs["opd_grpo"])
    for step in range(1, STEPS + 1):
        row = metrics[step]
        for key in (*PG_METRICS, "train/sampled_reverse_kl", "train/topk_forward_kl"):
            assert key in row, f"step {step} lacks {key}"
        # both of the teacher's outputs from one forward pass
        assert row["timing/train/teacher_topk_logprobs"] > 0
        assert "timing/train/teacher_topk" not in row and "timing/train/teacher_logprobs" not in row
        assert row["generation/logprob_mismatch"] < 1e-3
        # The advantage is the sum of its terms: the reward's (GRPO, centred per prompt) and the
        # OPD term, -opd_coef (1) x the sampled reverse KL (opd_discount 0).
        terms = row["train/reward_term_mean"] + row["train/opd_term_mean"]
        assert row["train/advantage_mean"] == pytest.approx(terms, rel=1e-6, abs=1e-9)
        assert row["train/opd_term_mean"] == pytest.approx(-row["train/sampled_reverse_kl"])
        assert row["train/sampled_reverse_kl"] != 0.0
        assert abs(row["train/reward_advantage_mean"]) < 1e-6
        # The loss is the policy gradient's plus 0.1 x the top-k divergence's.
        expected = row["train/pg_loss"] + 0.1 * row["train/topk_loss"]
        assert row["train/loss"] == pytest.approx(expected, rel=1e-5, abs=1e-8)
    assert "validation/reverse_kl" in metrics[STEPS]


def test_opd_rl_resumes_exactly(runs):
    dirs, output = runs
    assert output[2].rstrip().endswith("exit 2 0"), output[2][-3000:]
    resumed_from = dirs["opd_rl_resumed"] / "checkpoints" / "step_1"
    assert f"resumed from {resumed_from} (step 1)" in output[3], output[3][-3000:]
    assert output[3].rstrip().endswith("exit 3 0"), output[3][-3000:]
    straight, resumed = read_metrics(dirs["opd_rl"]), read_metrics(dirs["opd_rl_resumed"])
    assert sorted(straight) == list(range(1, STEPS + 1))
    assert sorted(resumed) == list(range(2, STEPS + 1))
    for step in range(1, STEPS + 1):
        assert "train/sampled_reverse_kl" in straight[step]
        assert "timing/train/teacher_logprobs" in straight[step]  # no top-k term: no top-k
        assert "timing/train/teacher_topk" not in straight[step]
    for step in range(2, STEPS + 1):
        for key in (*PG_METRICS, "train/sampled_reverse_kl"):
            assert resumed[step][key] == pytest.approx(straight[step][key], rel=1e-4, abs=1e-6), (
                f"step {step} {key}: resumed {resumed[step][key]} vs {straight[step][key]}"
            )
    assert resumed[STEPS]["validation/accuracy"] == straight[STEPS]["validation/accuracy"]
