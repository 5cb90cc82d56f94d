"""The objective section: which terms need a teacher, and the load-time errors of bad
combinations (each one message naming the keys)."""

import pytest
from config_errors import error_of

from nemo_opd.config import validate_config


def policy_gradient(config, **objective):
    config["objective"] = {"loss": "policy_gradient", **objective}
    return config


def test_default_objective_is_topk_distillation(minimal):
    cfg = validate_config(minimal)
    assert cfg.objective.loss == "topk_kl"
    assert cfg.objective.uses_topk and cfg.objective.uses_teacher
    assert not cfg.objective.uses_sampled_teacher and not cfg.objective.uses_reward


@pytest.mark.parametrize(
    ("objective", "topk", "sampled", "reward"),
    [
        ({"opd_coef": 1.0}, False, True, False),
        ({"opd_coef": 1.0, "topk_kl_coef": 0.5}, True, True, False),
        ({"opd_coef": 0.5, "reward_estimator": "grpo"}, False, True, True),
        ({"reward_estimator": "rloo", "topk_kl_coef": 1.0}, True, False, True),
    ],
)
def test_terms_decide_what_the_teacher_computes(minimal, objective, topk, sampled, reward):
    cfg = validate_config(policy_gradient(minimal, **objective))
    assert (cfg.objective.uses_topk, cfg.objective.uses_sampled_teacher) == (topk, sampled)
    assert cfg.objective.uses_reward == reward and cfg.objective.uses_teacher


def test_reward_only_runs_without_a_teacher(minimal):
    minimal["teacher"] = None
    cfg = validate_config(policy_gradient(minimal, reward_estimator="grpo"))
    assert cfg.teacher is None and not cfg.objective.uses_teacher


def test_grpo_needs_several_generations_per_prompt(minimal):
    minimal["teacher"] = None
    minimal["distillation"]["num_generations_per_prompt"] = 1
    minimal["policy"]["train_global_batch_size"] = 4
    message = error_of(policy_gradient(minimal, reward_estimator="grpo"))
    assert "objective.reward_estimator 'grpo'" in message
    assert "distillation.num_generations_per_prompt must be at least 2 (it is 1)" in message


def test_every_coefficient_zero_is_refused(minimal):
    minimal["teacher"] = None
    message = error_of(
        policy_gradient(minimal, opd_coef=0.0, reward_estimator="grpo", reward_coef=0.0)
    )
    assert "every advantage term is off" in message and "objective.opd_coef > 0" in message


def test_teacher_objective_without_a_teacher_is_refused(minimal):
    minimal["teacher"] = None
    message = error_of(policy_gradient(minimal, opd_coef=1.0))
    assert "needs the teacher" in message and "teacher is null" in message
    minimal.pop("objective")
    assert "needs the teacher" in error_of(minimal)  # the default top-k distillation


def test_unused_teacher_is_refused(minimal):
    message = error_of(policy_gradient(minimal, reward_estimator="grpo"))
    assert "teacher is configured but no objective term uses it" in message
    assert "teacher=null" in message


def test_policy_gradient_keys_under_topk_kl_are_refused(minimal):
    minimal["objective"] = {"opd_coef": 1.0, "reward_estimator": "grpo"}
    message = error_of(minimal)
    assert "objective.opd_coef (1.0), objective.reward_estimator ('grpo')" in message
    assert "only apply to objective.loss 'policy_gradient'" in message


def test_policy_gradient_needs_sampling(minimal):
    minimal["policy"]["generation"]["temperature"] = 0.0
    message = error_of(policy_gradient(minimal, opd_coef=1.0))
    assert "policy.generation.temperature must be above 0" in message


def test_unknown_estimator_is_refused(minimal):
    message = error_of(policy_gradient(minimal, reward_estimator="ppo"))
    assert "objective.reward_estimator" in message
