"""Refit probe: how far the generation engine's log-probs are from the student's own."""

import torch


def logprob_mismatch(
    generated_logprobs: torch.Tensor, student_logprobs: torch.Tensor, mask: torch.Tensor
) -> float:
    """Mean |generated - student| over the generated tokens.

    Args:
        generated_logprobs: [B, S] log-probs the engine reported for each token (0 elsewhere).
        student_logprobs: [B, S] the student's log-probs of the same tokens, same alignment and
            temperature (e.g. Policy.get_logprobs shifted so both index the scored token: made
            with the model family's own output head, nemo_opd/models/output_head.py, as the
            generation engine makes its own).
        mask: [B, S] 1 where a generated token is scored, 0 for prompt and padding.

    Returns:
        The mean absolute difference per masked token (0.0 when the mask is empty): near 0
        after a healthy refit, near the per-token KL after a stale one (docs/distillation.md
        has the figures in fp32 and bf16).
    """
    mask = mask.to(torch.float32)
    diff = (generated_logprobs.float() - student_logprobs.float()).abs() * mask
    count = mask.sum()
    return float(diff.sum() / count) if count > 0 else 0.0
