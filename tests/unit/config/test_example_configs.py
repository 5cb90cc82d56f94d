"""Every YAML under examples/configs/ loads and validates (new files are picked up by the glob)."""

from pathlib import Path

import pytest
from shipped_recipes import CONFIGS, OWN_MODEL_KEYS, SET_BY_THE_USER, load_recipe

from nemo_opd.config import ConfigError, load_config, to_yaml

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = sorted((REPO / "examples" / "configs").glob("**/*.yaml"))


def test_examples_exist():
    names = {path.name for path in EXAMPLES}
    assert {
        "distillation_math.yaml",
        "distillation_math_megatron.yaml",
        "distillation_tiny.yaml",
        "distillation_tiny_megatron.yaml",
    } <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda path: path.name)
def test_example_config_is_valid(path, tmp_path):
    cfg = load_config(path, SET_BY_THE_USER.get(path.name, []))
    printed = tmp_path / "printed.yaml"
    printed.write_text(to_yaml(cfg))
    assert load_config(printed) == cfg


def test_math_config():
    cfg = load_config(REPO / "examples/configs/distillation_math.yaml")
    assert cfg.policy.model_name == "Qwen/Qwen3-1.7B-Base"
    assert cfg.teacher.model_name == "Qwen/Qwen3-4B"
    assert cfg.policy.tokenizer.name == cfg.policy.model_name  # ${..model_name}
    assert cfg.policy.backend == cfg.teacher.backend == "dtensor"
    assert cfg.distillation.topk_logits_k == 64
    assert cfg.cluster.world_size == 8
    assert cfg.policy.generation.vllm_cfg.max_model_len == cfg.policy.max_total_sequence_length
    assert cfg.policy.sequence_packing.train_mb_tokens == 8192  # ${mul:...}
    assert cfg.teacher.optimizer is None and cfg.teacher.generation is None


def test_one_gpu_config_runs_in_one_process_and_shares_the_students_module(monkeypatch):
    """distillation_math_1gpu.yaml: one worker, so no Ray; lockstep with colocated generation;
    the teacher Qwen3-8B held in bf16; activation checkpointing; the transformers engine (no
    vLLM) generating from the student's own module."""
    from nemo_opd.algorithms.preflight import input_problems
    from nemo_opd.config.executor import run_executor
    from nemo_opd.generation import backends

    cfg = load_recipe(CONFIGS / "distillation_math_1gpu.yaml")
    assert cfg.cluster.world_size == 1 and run_executor(cfg, environ={}) == "local"
    assert (cfg.policy.model_name, cfg.teacher.model_name) == (
        "Qwen/Qwen3-1.7B-Base",
        "Qwen/Qwen3-8B",
    )
    assert cfg.policy.precision == cfg.teacher.precision == "bfloat16"
    assert cfg.policy.dtensor_cfg.activation_checkpointing
    assert cfg.distillation.max_staleness == 0 and cfg.policy.generation.colocated.enabled
    assert cfg.policy.sequence_packing.train_mb_tokens == 4 * cfg.policy.max_total_sequence_length
    rollouts = cfg.distillation.num_prompts_per_step * cfg.distillation.num_generations_per_prompt
    assert rollouts % cfg.policy.train_global_batch_size == 0
    assert input_problems(cfg) == []  # the pre-flight: nothing local is missing (hub names)
    monkeypatch.setattr(backends, "vllm_installed", lambda: False)
    local = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"executor": "local"})})
    assert backends.shares_student_module(local)


def test_megatron_config_inherits_and_switches_backend():
    math = load_config(REPO / "examples/configs/distillation_math.yaml")
    cfg = load_config(REPO / "examples/configs/distillation_math_megatron.yaml")
    assert cfg.policy.backend == cfg.teacher.backend == "megatron"
    assert not cfg.policy.dtensor_cfg.enabled and not cfg.teacher.dtensor_cfg.enabled
    assert cfg.policy.model_name == math.policy.model_name
    assert cfg.data == math.data and cfg.loss_fn == math.loss_fn


def test_tiny_config_is_the_cpu_default():
    cfg = load_config(REPO / "examples/configs/distillation_tiny.yaml")
    assert cfg.cluster.device == "cpu" and cfg.cluster.world_size == 1
    assert cfg.cluster.cpus_per_worker == 2  # one worker per model, using both cores
    assert (cfg.policy.model_name, cfg.teacher.model_name) == ("tiny:student", "tiny:teacher")
    assert cfg.policy.tokenizer.name == cfg.teacher.tokenizer.name == "tiny:tokenizer"
    assert cfg.data.dataset_name == "tiny_math"
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("prompt", "answer")  # tiny_math records
    assert cfg.policy.precision == cfg.teacher.precision == "float32"
    assert cfg.policy.generation.vllm_cfg.precision == "float32"  # ${...precision}
    assert cfg.policy.generation.max_new_tokens <= cfg.policy.max_total_sequence_length == 128
    assert cfg.distillation.val_at_start and cfg.distillation.val_at_end
    assert cfg.checkpointing.checkpoint_dir.startswith("runs/")
    assert cfg.logger.log_dir.startswith("runs/")


def test_tiny_config_can_switch_to_megatron_by_override():
    cfg = load_config(
        REPO / "examples/configs/distillation_tiny.yaml",
        ["policy.dtensor_cfg.enabled=false", "policy.megatron_cfg.enabled=true"],
    )
    assert cfg.policy.backend == "megatron" and cfg.teacher.backend == "dtensor"


def test_rl_objective_configs():
    # their base
    default = load_config(REPO / "examples/configs/distillation_tiny_100_lockstep.yaml")
    opd = load_config(REPO / "examples/configs/opd_rl_tiny.yaml")
    grpo = load_config(REPO / "examples/configs/grpo_tiny.yaml")
    hybrid = load_config(REPO / "examples/configs/opd_grpo_tiny.yaml")
    assert default.objective.loss == "topk_kl" and default.objective.uses_topk
    # tinker-cookbook / SkyRL: sampled reverse KL per token, plain importance sampling.
    assert opd.objective.loss == "policy_gradient" and opd.objective.uses_sampled_teacher
    assert opd.objective.opd_discount == 0 and not opd.objective.uses_reward
    assert opd.objective.clip_eps_low is opd.objective.clip_eps_high is opd.objective.is_cap is None
    assert not opd.objective.uses_topk and opd.teacher is not None
    # GRPO alone: no teacher anywhere.
    assert grpo.teacher is None and not grpo.objective.uses_teacher
    assert grpo.objective.reward_estimator == "grpo" and grpo.objective.uses_reward
    # slime: GRPO plus the OPD term, same rollouts per step as GRPO.
    assert hybrid.objective.uses_reward and hybrid.objective.opd_coef > 0 and hybrid.teacher
    assert hybrid.teacher.model_name == default.teacher.model_name
    for cfg in (opd, grpo, hybrid):
        loop = cfg.distillation
        rollouts = loop.num_prompts_per_step * loop.num_generations_per_prompt
        assert rollouts == 64 and loop.max_num_steps == default.distillation.max_num_steps
        # the same student and settings, each at its own tuned learning rate (docs/tuning.md)
        same_rate = cfg.policy.optimizer.model_copy(update={"lr": default.policy.optimizer.lr})
        assert same_rate == default.policy.optimizer
        assert cfg.policy.model_copy(update={"optimizer": same_rate}) == default.policy


def test_the_own_model_recipe_names_each_key_a_user_must_set():
    path = REPO / "examples/configs/own_model_cpu.yaml"
    header = path.read_text().split("defaults:")[0]
    for override in OWN_MODEL_KEYS:
        key = override.split("=")[0]
        assert key in header
        with pytest.raises(ConfigError, match=rf"^{key}: mandatory value '\?\?\?' was never set"):
            load_config(path, [o for o in OWN_MODEL_KEYS if o != override])


def test_the_own_model_recipe_inherits_nothing_of_the_tiny_models():
    # Extending distillation_tiny.yaml brought tiny:tokenizer, prompt_key: prompt and the tiny
    # run's folders along with a user's models.
    cfg = load_config(REPO / "examples/configs/own_model_cpu.yaml", OWN_MODEL_KEYS)
    tiny = load_config(REPO / "examples/configs/distillation_tiny.yaml")
    for model in (cfg.policy, cfg.teacher):
        assert model.tokenizer.name == model.model_name
    assert (cfg.data.prompt_key, cfg.data.answer_key) == ("problem", "answer")
    assert cfg.data.dataset_name is None and cfg.data.response_key is None
    assert cfg.checkpointing.checkpoint_dir != tiny.checkpointing.checkpoint_dir
    assert cfg.logger.log_dir != tiny.logger.log_dir
    assert cfg.cluster.device == "cpu" and cfg.cluster.world_size == 1
    assert cfg.policy.generation.vllm_cfg.kv_cache_memory_bytes is not None
