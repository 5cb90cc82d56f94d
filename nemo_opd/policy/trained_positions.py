"""A scoring answer cut to the positions a loss reads, for the trip from a worker to the driver.

With trained_only, a teacher's top-k, log-probs and hidden states are read only where the next
token is trained: the loss mask's positions (build_loss_mask of the rows' token_mask). A worker
sends those positions' values alone ([n, ...] instead of [B, S, ...]); the driver, which holds
the same rows, puts them back in place with 0 elsewhere. The prompts' positions and the padding
of short rows to the longest never cross the process boundary: at 64 prompt and 128 sampled
tokens a third of a row, and the hidden states are H values per position.

    answer = packed(worker_answer, data["token_mask"])     # on the worker: {name: [n, ...]}
    answer = unpacked(answer, data["token_mask"])          # on the driver: {name: [B, S, ...]}
"""

import torch

from nemo_opd.losses.distillation_loss import build_loss_mask


def trained_positions(token_mask: torch.Tensor) -> torch.Tensor:
    """[B, S] bool: where the next token is trained (token_mask[:, t + 1], last position
    never), the positions a loss reads."""
    return build_loss_mask(token_mask) != 0


def packed(answer: dict[str, torch.Tensor], token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """{name: [B, S, ...]} -> {name: [n, ...]}, the values at the n trained positions in
    row-major order."""
    where = trained_positions(token_mask)
    return {name: value[where.to(value.device)] for name, value in answer.items()}


def unpacked(answer: dict[str, torch.Tensor], token_mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """packed()'s inverse on the same rows: {name: [B, S, ...]}, 0 where no loss reads."""
    where = trained_positions(token_mask)
    count = int(where.sum())
    out = {}
    for name, value in answer.items():
        if value.shape[0] != count:
            raise ValueError(
                f"{name}: {value.shape[0]} packed positions for rows with {count} trained "
                "positions (an answer packed on other rows)"
            )
        full = value.new_zeros((*where.shape, *value.shape[1:]))
        full[where.to(value.device)] = value
        out[name] = full
    return out
