"""Helpers for the vLLM tests: tiny Qwen3 checkpoints, configs and an HF fp32 reference."""

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from nemo_opd.config import GenerationConfig

VOCAB = 256
MAX_LEN = 96
TEMPERATURE = 0.8


def tiny_qwen3() -> Qwen3Config:
    """Tied embeddings, vocab 256. head_dim 32: vLLM's CPU attention has no kernel for 16."""
    return Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        max_position_embeddings=MAX_LEN,
        tie_word_embeddings=True,
        rms_norm_eps=1e-6,
    )


def save_tiny_model(path, seed: int) -> str:
    """Save a random fp32 model; its embeddings are scaled up so that the next-token
    distributions are neither uniform nor one-hot."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_qwen3(), dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(4.0)
    model.save_pretrained(path)
    return str(path)


def load_reference(model_dir: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """HF-named tensors with lm_head.weight present even when tied (what Policy.full_weights
    returns)."""
    weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
    weights["lm_head.weight"] = model.get_output_embeddings().weight.detach().clone()
    return weights


def generation_config(**overrides) -> GenerationConfig:
    raw = {
        "temperature": TEMPERATURE,
        "max_new_tokens": 16,
        "vllm_cfg": {
            "max_model_len": MAX_LEN,
            "precision": "float32",
            "enforce_eager": True,
            # a fixed KV cache: a fraction of RAM (gpu_memory_utilization) differs by machine
            "kv_cache_memory_bytes": 64 * 2**20,
        },
        **overrides,
    }
    return GenerationConfig.model_validate(raw)


def random_prompts(num: int, seed: int = 0, min_len: int = 3, max_len: int = 12) -> list:
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, max_len + 1, (num,), generator=gen)
    return [torch.randint(1, VOCAB, (int(n),), generator=gen).tolist() for n in lengths]


def reference_token_logprobs(
    model, prompt: list[int], completion: list[int], temperature: float = 1.0, top_k=None
) -> torch.Tensor:
    """[len(completion)] HF fp32 log-probs of each completion token given everything before it,
    at `temperature`, renormalized over the top_k logits when top_k is given."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float() / temperature
    if top_k is not None:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logp = torch.log_softmax(logits, dim=-1)
    return logp.gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1)
