"""output_head_of and OutputHead: each known family's head, applied to the model's final hidden
states and its own LM-head rows (and bias), computes what the family's Hugging Face forward
computes, exactly; shard by shard under a vocabulary split; and a head nemo_opd does not know
is refused with its model_type named."""

import pytest
import torch
import transformers
from model_families import FAMILIES, NOT_PLAIN, VOCAB, build_family_model, family_config

from nemo_opd.models.head_families import FAMILIES as KNOWN
from nemo_opd.models.head_families import UnknownHeadError
from nemo_opd.models.output_head import PLAIN_HEAD, output_head_of


def forward_and_parts(model: torch.nn.Module, seed: int = 0):
    """(HF logits [B, S, V], final hidden states [B, S, H], W [V, H], b [V] or None)."""
    ids = torch.randint(1, VOCAB, (3, 10), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        logits = model(input_ids=ids).logits
        hidden = model.get_decoder()(input_ids=ids).last_hidden_state
    head = model.get_output_embeddings()
    return logits, hidden, head.weight.detach(), head.bias


def test_every_known_family_is_tested():
    assert set(KNOWN) == set(FAMILIES)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_head_computes_the_family_forward(family):
    model = build_family_model(family, seed=1)
    want, hidden, weight, bias = forward_and_parts(model)
    head = output_head_of(model.config)
    assert head.family == family and head.tied == model.config.tie_word_embeddings
    assert head.biased == (bias is not None)
    assert head.is_plain == (family not in NOT_PLAIN)
    torch.testing.assert_close(head.logits(hidden, weight, bias), want, rtol=0, atol=1e-6)
    if family in NOT_PLAIN:  # the step matters: the plain product is far from the forward
        plain = PLAIN_HEAD.logits(hidden, weight)
        assert (plain - want).abs().max() > 0.5


@pytest.mark.parametrize("family", ["phi", "granite", "cohere", "gemma2"])
def test_head_applies_per_vocabulary_shard(family):
    """Under tensor parallelism each rank holds [V / tp, H] rows and [V / tp] biases: the
    shards' logits, side by side, are the whole head's."""
    model = build_family_model(family, seed=2)
    want, hidden, weight, bias = forward_and_parts(model, seed=2)
    head = output_head_of(model.config)
    splits = (100, 100, VOCAB - 200)
    weights = weight.split(splits)
    biases = bias.split(splits) if bias is not None else (None,) * len(splits)
    shards = [head.logits(hidden, w, b) for w, b in zip(weights, biases, strict=True)]
    torch.testing.assert_close(torch.cat(shards, dim=-1), want, rtol=0, atol=1e-6)


def test_plain_head_adds_no_operation():
    raw = torch.randn(4, 7)
    assert PLAIN_HEAD.transform(raw) is raw
    assert output_head_of(family_config("qwen3")).transform(raw) is raw


def test_head_names_its_weights_in_a_checkpoint():
    tied = output_head_of(family_config("gemma2"))
    assert tied.weight_names == ("model.embed_tokens.weight",) and tied.bias_name is None
    phi = output_head_of(family_config("phi"))
    assert phi.weight_names == ("lm_head.weight",) and phi.bias_name == "lm_head.bias"


def test_a_soft_cap_of_none_is_a_plain_head():
    assert output_head_of(family_config("gemma2", final_logit_softcapping=None)).is_plain


@pytest.mark.parametrize(
    "config, named",
    [
        (transformers.GPT2Config(), "'gpt2'"),
        (transformers.FalconH1Config(), "'falcon_h1'"),
        (transformers.Gemma3Config(), "gemma3_text"),
    ],
    ids=["gpt2", "falcon_h1", "gemma3_image_text"],
)
def test_unknown_heads_are_refused_by_name(config, named):
    with pytest.raises(UnknownHeadError, match=named):
        output_head_of(config)


def test_a_logit_step_the_family_does_not_take_is_refused():
    """A llama config that sets Granite's logits_scaling (say, a converted checkpoint): the
    Llama head would ignore it, so the model is refused rather than guessed at."""
    config = family_config("llama", logits_scaling=8.0)
    with pytest.raises(UnknownHeadError, match="logits_scaling=8.0"):
        output_head_of(config)
    neutral = family_config("llama", logits_scaling=1.0)  # a value that changes nothing
    assert output_head_of(neutral).is_plain
