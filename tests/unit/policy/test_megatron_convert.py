"""HF <-> Megatron conversion: exact round trips and Megatron's layout of each fused weight and
of the padded vocabulary."""

import pytest
import torch
from transformers import LlamaConfig, Qwen3Config

from nemo_opd.policy.engines.megatron_convert import (
    GPTShape,
    conversion_rules,
    hf_to_megatron,
    megatron_to_hf,
)

HIDDEN, FFN, VOCAB = 24, 40, 36


def _config(family: str, tied: bool, vocab: int = VOCAB):
    common = {
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": FFN,
        "num_hidden_layers": 2,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "head_dim": 6,
        "tie_word_embeddings": tied,
    }
    return Qwen3Config(**common) if family == "qwen3" else LlamaConfig(**common)


def _random_hf_state(config) -> dict[str, torch.Tensor]:
    """Random tensors of the Hugging Face model's parameter shapes (lm_head absent if tied)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    gen = torch.Generator().manual_seed(0)
    state = {}
    for name, param in model.named_parameters():
        state[name] = torch.randn(param.shape, generator=gen)
    return state


@pytest.mark.parametrize("family", ["qwen3", "llama"])
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_round_trip_is_exact(family, tied, tp):
    config = _config(family, tied)
    shape = GPTShape.from_hf_config(config, tp)
    hf = _random_hf_state(config)
    shards = [hf_to_megatron(hf, shape, rank, tp) for rank in range(tp)]
    rows = {s["embedding.word_embeddings.weight"].shape[0] for s in shards}
    assert rows == {shape.padded_vocab_size // tp}
    back = dict(megatron_to_hf(shards, shape))
    assert set(back) == set(hf)
    for name, tensor in hf.items():
        assert torch.equal(back[name], tensor), name
    # Every HF tensor is used exactly once.
    used = [n for rule in conversion_rules(shape) for n in rule.hf_names]
    assert sorted(used) == sorted(hf)


def test_llama_has_no_qk_norm_and_head_dim_defaults():
    config = LlamaConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=1)
    del config.head_dim
    shape = GPTShape.from_hf_config(config)
    assert shape.head_dim == 8 and not shape.qk_norm
    names = [rule.megatron_name for rule in conversion_rules(shape)]
    assert not any("layernorm.weight" in n and "self_attention" in n for n in names)


def test_qkv_shard_holds_its_query_groups():
    """Rank r's linear_qkv rows are, per local group g (global group r * G / tp + g): the
    group's query heads, then its key head, then its value head (Megatron's split)."""
    config = _config("qwen3", tied=True)
    shape = GPTShape.from_hf_config(config)
    hf = _random_hf_state(config)
    tp, groups, d = 2, shape.num_kv_heads, shape.head_dim
    per_group = shape.num_heads // groups
    attn = "model.layers.1.self_attn."
    q = hf[attn + "q_proj.weight"].view(shape.num_heads, d, HIDDEN)
    k = hf[attn + "k_proj.weight"].view(groups, d, HIDDEN)
    v = hf[attn + "v_proj.weight"].view(groups, d, HIDDEN)
    for rank in range(tp):
        fused = hf_to_megatron(hf, shape, rank, tp)[
            "decoder.layers.1.self_attention.linear_qkv.weight"
        ]
        local = fused.view(groups // tp, (per_group + 2) * d, HIDDEN)
        for g in range(groups // tp):
            group = rank * groups // tp + g
            heads = q[group * per_group : (group + 1) * per_group].reshape(-1, HIDDEN)
            q_rows, k_rows, v_rows = local[g].split([per_group * d, d, d])
            assert torch.equal(q_rows, heads)
            assert torch.equal(k_rows, k[group]) and torch.equal(v_rows, v[group])


def test_fc1_shard_is_gate_then_up():
    """SwiGLU in Megatron chunks the local fc1 output in two: silu(first) * second."""
    config = _config("llama", tied=False)
    shape = GPTShape.from_hf_config(config)
    hf = _random_hf_state(config)
    gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
    for rank in range(2):
        fc1 = hf_to_megatron(hf, shape, rank, 2)["decoder.layers.0.mlp.linear_fc1.weight"]
        first, second = fc1.chunk(2)
        assert torch.equal(first, gate.chunk(2)[rank]) and torch.equal(second, up.chunk(2)[rank])


def test_vocab_and_row_parallel_shards():
    """The vocabulary (301, odd) is padded to 512 rows at tp=2: rank 0 holds ids 0..255, rank 1
    ids 256..300 and 211 zero rows; the way back strips them."""
    config = _config("qwen3", tied=False, vocab=301)
    shape = GPTShape.from_hf_config(config, tp=2)
    assert (shape.vocab_size, shape.padded_vocab_size) == (301, 512)
    assert GPTShape.from_hf_config(config, tp=2, multiple=1).padded_vocab_size == 302
    hf = _random_hf_state(config)
    shards = [hf_to_megatron(hf, shape, rank, 2) for rank in range(2)]
    for name, hf_name in (
        ("output_layer.weight", "lm_head.weight"),
        ("embedding.word_embeddings.weight", "model.embed_tokens.weight"),
    ):
        first, second = (shard[name] for shard in shards)
        assert torch.equal(first, hf[hf_name][:256])
        assert torch.equal(second[:45], hf[hf_name][256:])
        assert not second[45:].any() and second.shape[0] == 256
    back = dict(megatron_to_hf(shards, shape))
    assert torch.equal(back["lm_head.weight"], hf["lm_head.weight"])
    o_proj = hf["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(
        shards[1]["decoder.layers.0.self_attention.linear_proj.weight"],
        o_proj[:, o_proj.shape[1] // 2 :],
    )


def test_padded_vocabulary_must_divide_by_tp():
    shape = GPTShape.from_hf_config(_config("qwen3", tied=True), tp=1)  # 128 rows
    with pytest.raises(ValueError, match=r"padded vocabulary \(128\) does not divide by 3"):
        hf_to_megatron(_random_hf_state(_config("qwen3", tied=True)), shape, 0, 3)
