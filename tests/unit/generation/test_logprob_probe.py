"""logprob_mismatch: the refit probe's mean absolute log-prob difference."""

import torch

from nemo_opd.generation import logprob_mismatch


def test_mean_absolute_difference_over_masked_tokens():
    generated = torch.tensor([[0.0, -1.0, -2.0], [-0.5, -0.5, 0.0]])
    student = torch.tensor([[9.0, -1.5, -2.0], [-0.25, -0.5, 7.0]])
    mask = torch.tensor([[0, 1, 1], [1, 1, 0]])
    assert logprob_mismatch(generated, student, mask) == (0.5 + 0.0 + 0.25 + 0.0) / 4


def test_empty_mask_gives_zero():
    zeros = torch.zeros(2, 3)
    assert logprob_mismatch(zeros, zeros + 1, zeros) == 0.0
