"""Message logs (one conversation per rollout) and the tensors the policy trains on."""

import torch

from nemo_opd.data.batching import TensorBatch

Message = dict
"""One turn of a message log: {"role": "system" | "user" | "assistant", "content": str,
"token_ids": [the turn's tokens as the model saw them], ...}; generated turns also carry
"generation_logprobs"."""


def flatten_message_logs(
    logs: list[list[Message]], pad_token_id: int, pad_to_multiple: int = 1
) -> TensorBatch:
    """Concatenate each log's token ids into one right-padded row.

    Returns a TensorBatch:
        input_ids     [B, S] int64 (pad_token_id after each row's end; S a multiple of
                      pad_to_multiple)
        input_lengths [B] int64
        token_mask    [B, S] float32, 1 on assistant tokens (the ones the student generated)
        sample_mask   [B] float32, all ones
    """
    rows = [_row(log) for log in logs]
    longest = max(len(ids) for ids, _ in rows)
    length = -(-longest // pad_to_multiple) * pad_to_multiple
    input_ids = torch.full((len(rows), length), pad_token_id, dtype=torch.long)
    token_mask = torch.zeros(len(rows), length)
    for i, (ids, mask) in enumerate(rows):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        token_mask[i, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    return TensorBatch(
        input_ids=input_ids,
        input_lengths=torch.tensor([len(ids) for ids, _ in rows], dtype=torch.long),
        token_mask=token_mask,
        sample_mask=torch.ones(len(rows)),
    )


def _row(log: list[Message]) -> tuple[list[int], list[float]]:
    ids, mask = [], []
    for message in log:
        ids += list(message["token_ids"])
        mask += [float(message["role"] == "assistant")] * len(message["token_ids"])
    return ids, mask


def log_length(log: list[Message]) -> int:
    """Tokens in a message log."""
    return sum(len(m["token_ids"]) for m in log)


def flatten_generation_logprobs(
    logs: list[list[Message]], length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The generation engine's log-prob of every generated token, placed at the token's own
    position: ([B, length] float32 values, [B, length] float32 mask of generated tokens)."""
    values = torch.zeros(len(logs), length)
    mask = torch.zeros(len(logs), length)
    for row, log in enumerate(logs):
        start = 0
        for message in log:
            count = len(message["token_ids"])
            if "generation_logprobs" in message:
                values[row, start : start + count] = torch.tensor(message["generation_logprobs"])
                mask[row, start : start + count] = 1.0
            start += count
    return values, mask
