"""Tiny random causal LMs of every output-head family nemo_opd knows, built from each family's
transformers config class, for tests against Hugging Face's own forward.

Each head's step is made to matter: the LM head's rows are scaled up (so the logits reach the
soft-caps and a scale changes the distribution visibly), soft-caps are small, and Phi's bias is
drawn at random (Hugging Face initializes it to zero). The attention-logit soft-cap of Gemma 2
is off: the engines' attention does not apply it, and setup refuses a model that has one.
"""

import torch
import transformers
from transformers import AutoModelForCausalLM

VOCAB = 301
"""Not a multiple of 128: the engines pad it (to 384), the bias of a biased head included."""
COMMON = {
    "vocab_size": VOCAB,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 64,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
}
MOE = {"num_experts_per_tok": 2, "moe_intermediate_size": 32}
FAMILIES = {
    "llama": ("LlamaConfig", {"head_dim": 8}),
    "mistral": ("MistralConfig", {"head_dim": 8}),
    "mixtral": ("MixtralConfig", {"head_dim": 8, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "qwen2": ("Qwen2Config", {}),
    "qwen2_moe": (
        "Qwen2MoeConfig",
        {**MOE, "num_experts": 4, "shared_expert_intermediate_size": 32},
    ),
    "qwen3": ("Qwen3Config", {"head_dim": 8, "tie_word_embeddings": True}),
    "qwen3_moe": ("Qwen3MoeConfig", {**MOE, "head_dim": 8, "num_experts": 4}),
    "gemma": ("GemmaConfig", {"head_dim": 8}),
    "phi3": ("Phi3Config", {"num_key_value_heads": 4}),
    "olmo2": ("Olmo2Config", {}),
    "phi": ("PhiConfig", {"tie_word_embeddings": False}),
    "granite": ("GraniteConfig", {"logits_scaling": 8.0}),
    "granitemoe": (
        "GraniteMoeConfig",
        {"logits_scaling": 6.0, "num_local_experts": 4, "num_experts_per_tok": 2},
    ),
    "cohere": ("CohereConfig", {"logit_scale": 0.25}),
    "cohere2": ("Cohere2Config", {"logit_scale": 0.25, "head_dim": 8}),
    "gemma2": (
        "Gemma2Config",
        {"head_dim": 8, "final_logit_softcapping": 4.0, "attn_logit_softcapping": None},
    ),
    "gemma3_text": ("Gemma3TextConfig", {"head_dim": 8, "final_logit_softcapping": 4.0}),
}
"""model_type -> (transformers config class, its settings besides COMMON)."""
NOT_PLAIN = ("phi", "granite", "granitemoe", "cohere", "cohere2", "gemma2", "gemma3_text")
"""The families whose head adds something to h W^T."""
HEAD_SCALE = 12.0


def family_config(model_type: str, **overrides) -> transformers.PretrainedConfig:
    """The tiny config of a family (FAMILIES), with `overrides`."""
    class_name, settings = FAMILIES[model_type]
    config = getattr(transformers, class_name)(**{**COMMON, **settings, **overrides})
    assert config.model_type == model_type
    return config


def build_family_model(model_type: str, seed: int = 0, **overrides) -> torch.nn.Module:
    """A random float32 model of the family, eval mode, its head made to matter."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(
        family_config(model_type, **overrides), dtype=torch.float32, attn_implementation="eager"
    )
    head = model.get_output_embeddings()
    with torch.no_grad():
        head.weight.mul_(HEAD_SCALE)
        if head.bias is not None:
            head.bias.normal_(0.0, 2.0)
    return model.eval()


def save_family_model(model_type: str, path, seed: int = 0, **overrides) -> str:
    """build_family_model saved with save_pretrained in `path`; returns the folder."""
    build_family_model(model_type, seed, **overrides).save_pretrained(path)
    return str(path)
