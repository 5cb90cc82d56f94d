"""policy.lora: its fields, and the backends and models that refuse it at load."""

import pytest
from config_errors import error_of

from nemo_opd.config import ConfigError, apply_overrides, validate_config
from nemo_opd.config.model_schema import LORA_TARGETS


def test_lora_is_off_by_default_and_set_by_overrides(minimal):
    assert validate_config(minimal).policy.lora.enabled is False
    data = apply_overrides(
        minimal,
        [
            "policy.lora.enabled=true",
            "policy.lora.rank=8",
            "policy.lora.learning_rate=1e-2",
            "policy.lora.target_modules=[q_proj,v_proj]",
        ],
    )
    lora = validate_config(data).policy.lora
    assert (lora.enabled, lora.rank, lora.alpha, lora.learning_rate) == (True, 8, 32.0, 1e-2)
    assert lora.target_modules == ["q_proj", "v_proj"]
    assert validate_config(minimal).policy.lora.target_modules == list(LORA_TARGETS)


@pytest.mark.parametrize(
    "override, named",
    [
        ("policy.lora.rank=0", "policy.lora.rank"),
        ("policy.lora.dropout=1.0", "policy.lora.dropout"),
        ("policy.lora.target_modules=[lm_head]", "policy.lora.target_modules"),
        ("policy.lora.target_modules=[]", "policy.lora.target_modules"),
    ],
)
def test_bad_lora_values_are_named(minimal, override, named):
    assert named in error_of(apply_overrides(minimal, [override]))


def test_an_unknown_lora_key_is_named_with_the_close_one(minimal):
    with pytest.raises(ConfigError, match=r"unknown key policy.lora.ranks; did you mean 'rank'"):
        apply_overrides(minimal, ["policy.lora.ranks=8"])


def test_megatron_refuses_a_lora_student(minimal):
    data = apply_overrides(
        minimal,
        [
            "policy.lora.enabled=true",
            "policy.megatron_cfg.enabled=true",
            "policy.dtensor_cfg.enabled=false",
        ],
    )
    message = error_of(data)
    assert "policy.lora.enabled is true with policy.megatron_cfg.enabled" in message
    assert "DTensor backend only" in message


def test_a_teacher_refuses_lora(minimal):
    message = error_of(apply_overrides(minimal, ["teacher.lora.enabled=true"]))
    assert "teacher.lora.enabled must be false: the teacher is frozen" in message


def test_lora_dropout_needs_one_tensor_parallel_rank(minimal):
    base = ["policy.lora.enabled=true", "policy.lora.dropout=0.1"]
    validate_config(apply_overrides(minimal, base))  # dropout alone is fine
    tp2 = [*base, "policy.dtensor_cfg.tensor_parallel_size=2", "cluster.gpus_per_node=2"]
    message = error_of(apply_overrides(minimal, tp2))
    assert "policy.lora.dropout (0.1) with policy.dtensor_cfg.tensor_parallel_size 2" in message
    validate_config(apply_overrides(minimal, [*tp2[2:], "policy.lora.enabled=true"]))
