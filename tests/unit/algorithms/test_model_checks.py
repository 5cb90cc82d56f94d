"""check_model_family: setup refuses, naming the model and what to do, a model whose forward
the engines would not reproduce: an output head nemo_opd does not know, a head the Megatron
backend cannot express, and attention steps the engines' attention leaves out."""

import pytest
from model_families import family_config

from nemo_opd.algorithms.model_checks import check_model_family
from nemo_opd.config import PolicyConfig
from nemo_opd.errors import SetupError


def policy(backend: str = "dtensor", length: int = 64) -> PolicyConfig:
    raw = {"model_name": "m", "tokenizer": {"name": "m"}, "max_total_sequence_length": length}
    if backend == "megatron":
        raw |= {"dtensor_cfg": {"enabled": False}, "megatron_cfg": {"enabled": True}}
    return PolicyConfig.model_validate(raw)


@pytest.mark.parametrize("family", ["qwen3", "llama", "granite", "cohere", "gemma2", "phi"])
def test_known_heads_pass_on_dtensor(family):
    check_model_family(policy(), family_config(family), "teacher")


def test_an_unknown_head_is_refused_naming_its_model_type():
    from transformers import GPT2Config

    with pytest.raises(SetupError, match=r"teacher\.model_name: model_type 'gpt2': its output"):
        check_model_family(policy(), GPT2Config(), "teacher")


@pytest.mark.parametrize("family", ["granite", "gemma2", "phi"])
def test_megatron_refuses_a_head_beyond_the_product(family):
    check_model_family(policy("megatron"), family_config("qwen3"), "policy")
    refused = rf"policy\.model_name: the output head of model_type '{family}' .* use the DTensor"
    with pytest.raises(SetupError, match=refused):
        check_model_family(policy("megatron"), family_config(family), "policy")


def test_an_attention_soft_cap_is_refused():
    config = family_config("gemma2", attn_logit_softcapping=50.0)
    with pytest.raises(SetupError, match=r"attn_logit_softcapping=50\.0"):
        check_model_family(policy(), config, "teacher")


def test_a_sliding_window_is_refused_only_where_a_sequence_outgrows_it():
    config = family_config("mistral", sliding_window=64)
    check_model_family(policy(length=64), config, "policy")
    with pytest.raises(SetupError, match=r"policy\.max_total_sequence_length to at most 64"):
        check_model_family(policy(length=65), config, "policy")
