"""Rows for a served teacher's tests (tests/unit/teachers/test_served_teacher.py, without a
server, and tests/functional/test_served_teacher_loop.py, against a live one)."""

import torch


def ragged_batch(lengths, seed=0, width=None):
    """input_ids [B, S] (right-padded with 0) and input_lengths [B] of random tokens."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, 481, (length,), generator=generator)
    return {"input_ids": ids, "input_lengths": torch.tensor(lengths)}
