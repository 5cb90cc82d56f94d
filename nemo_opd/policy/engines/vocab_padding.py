"""The padded vocabulary: how engines split a vocabulary that tensor parallelism does not divide.

As Megatron does, an engine builds its embedding and output layer with V_pad rows: the real
vocabulary V rounded up to a multiple of policy.make_vocab_size_divisible_by x tp, so that
every tensor-parallel rank holds V_pad / tp rows (rank r: ids [r V_pad / tp, (r + 1) V_pad /
tp); the last ranks' shards may be partly or entirely padding). The padded rows are zero and
their logit columns are masked to -inf (mask_padded_logits) before any softmax, log-prob, top-k
or loss sees them, so they get no probability and no gradient.

Nothing padded leaves an engine: exported weights, checkpoints and optimizer moments have the
real V rows (resize_vocab_* strip them on the way out and pad them again on the way in), so a
checkpoint written at one tensor-parallel size loads at another, and in from_pretrained.
"""

import torch

from nemo_opd.data.batching import round_up

VOCAB_PAD_MULTIPLE = 128
"""The default of policy.make_vocab_size_divisible_by (Megatron's default too): rows per
tensor-parallel shard are a multiple of it, which keeps the output layer's shapes aligned."""

VOCAB_WEIGHTS = ("model.embed_tokens.weight", "lm_head.weight", "lm_head.bias")
"""The Hugging Face weights with one row (or entry) per vocabulary id."""


def padded_vocab_size(vocab_size: int, tp: int, multiple: int = VOCAB_PAD_MULTIPLE) -> int:
    """V rounded up to a multiple of `multiple` x tp."""
    return round_up(vocab_size, multiple * tp)


def resize_vocab_rows(tensor: torch.Tensor, rows: int) -> torch.Tensor:
    """A new tensor with `rows` rows along dim 0: the first rows of `tensor`, then zero rows."""
    if tensor.shape[0] >= rows:
        return tensor[:rows].clone()
    padding = tensor.new_zeros((rows - tensor.shape[0], *tensor.shape[1:]))
    return torch.cat([tensor, padding])


def resize_vocab_weights(weights: dict[str, torch.Tensor], rows: int) -> dict[str, torch.Tensor]:
    """{Hugging Face name: tensor} with the vocabulary weights resized to `rows` rows."""
    return {
        name: resize_vocab_rows(tensor, rows) if name in VOCAB_WEIGHTS else tensor
        for name, tensor in weights.items()
    }


def resize_vocab_optimizer_state(state: dict, rows: int) -> dict:
    """A torch full optimizer state dict keyed by Hugging Face name with the vocabulary
    weights' moments (every tensor of theirs but the scalar step) resized to `rows` rows.
    An empty dict (what a full gather leaves on ranks other than 0) is returned as is."""
    if not state:
        return state

    def resize(name: str, value):
        vocab_moment = name in VOCAB_WEIGHTS and isinstance(value, torch.Tensor) and value.dim()
        return resize_vocab_rows(value, rows) if vocab_moment else value

    per_parameter = {
        name: {key: resize(name, value) for key, value in entry.items()}
        for name, entry in state["state"].items()
    }
    return {**state, "state": per_parameter}


def mask_padded_logits(logits: torch.Tensor, vocab_start: int, vocab_size: int) -> torch.Tensor:
    """Logits [..., V_local] of the shard whose first column is global id `vocab_start`, with
    the columns of ids >= vocab_size (padding) at -inf; `logits` itself when it has none."""
    real = vocab_size - vocab_start
    if real >= logits.shape[-1]:
        return logits
    padding = torch.arange(logits.shape[-1], device=logits.device) >= real
    return logits.masked_fill(padding, float("-inf"))
