"""loss_fn.support: the shipped full-vocabulary recipe, and what the hidden-state supports
refuse at load (one in-process teacher, the topk_kl objective)."""

from pathlib import Path

import pytest

from nemo_opd.config import ConfigError, load_config

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"


def test_the_full_vocabulary_recipe_is_the_lockstep_100_step_recipe_over_every_id():
    base = load_config(CONFIGS / "distillation_tiny_100_lockstep.yaml")
    full = load_config(CONFIGS / "distillation_tiny_full_vocab.yaml")
    assert base.loss_fn.support == "teacher_topk" and full.loss_fn.support == "full"
    assert full.loss_fn.model_copy(update={"support": "teacher_topk"}) == base.loss_fn
    assert full.policy == base.policy and full.teacher == base.teacher
    assert full.distillation == base.distillation


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["objective.loss=policy_gradient", "objective.opd_coef=1.0"], "topk_kl_coef > 0"),
        (["objective.loss=sft", "~teacher"], "objective.loss=sft"),
        (["teacher.server.enabled=true"], "served teacher"),
    ],
)
def test_hidden_state_supports_refuse_what_cannot_send_or_use_them(overrides, message):
    for support in ("full", "student_topk"):
        with pytest.raises(ConfigError, match=message) as caught:
            load_config(
                CONFIGS / "distillation_tiny_100.yaml", [f"loss_fn.support={support}", *overrides]
            )
        assert f"loss_fn.support={support}" in str(caught.value)


def test_an_unknown_support_names_the_choices():
    with pytest.raises(ConfigError, match="student_topk"):
        load_config(CONFIGS / "distillation_tiny_100.yaml", ["loss_fn.support=everything"])


def test_the_policy_gradient_divergence_term_may_run_over_every_id():
    """OPD as RL with the divergence term (topk_kl_coef > 0) over the full vocabulary: the
    teacher then sends hidden states and sampled-token log-probs from one forward pass."""
    cfg = load_config(
        CONFIGS / "opd_rl_tiny.yaml", ["objective.topk_kl_coef=0.1", "loss_fn.support=full"]
    )
    assert cfg.objective.uses_topk and cfg.objective.uses_sampled_teacher
