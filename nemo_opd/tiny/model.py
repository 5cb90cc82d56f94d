"""Build a randomly initialized tiny Qwen3 causal LM that matches a tokenizer."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, PreTrainedTokenizerBase, Qwen3Config, Qwen3ForCausalLM

from nemo_opd.tiny.recipe import ModelRecipe


def build_qwen3_config(recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase) -> Qwen3Config:
    """A Qwen3 config with tied embeddings, the tokenizer's vocab and special token ids.

    ``eos_token_id`` is ``<|im_end|>`` (the end of an assistant turn), so generation engines
    (transformers, vLLM) stop there.
    """
    return Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        head_dim=recipe.head_dim,
        max_position_embeddings=recipe.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": recipe.rope_theta},
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        dtype="float32",
    )


def build_generation_config(tokenizer: PreTrainedTokenizerBase) -> GenerationConfig:
    """Greedy by default; stops at ``<|im_end|>`` and pads with ``<|endoftext|>``."""
    return GenerationConfig(
        do_sample=False,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def build_tiny_model(
    recipe: ModelRecipe, tokenizer: PreTrainedTokenizerBase, seed: int
) -> Qwen3ForCausalLM:
    """A fresh fp32 model with sdpa attention; ``seed`` fixes the initial weights."""
    torch.manual_seed(seed)
    config = build_qwen3_config(recipe, tokenizer)
    model = Qwen3ForCausalLM._from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    model.generation_config = build_generation_config(tokenizer)
    return model


def count_parameters(model: torch.nn.Module) -> int:
    """Number of distinct parameters (a tied embedding counts once)."""
    return sum(p.numel() for p in model.parameters())
