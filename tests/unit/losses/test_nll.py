"""NLLLossFn against a float64 reference that shares no code with it."""

import pytest
import torch

from nemo_opd.losses import NLLLossFn


def reference(logits, targets, mask, denom, temperature=1.0):
    """-sum(mask * log_softmax(logits / T)[target]) / denom in float64, and its gradient."""
    z = logits.detach().double().requires_grad_()
    logp = torch.log_softmax(z / temperature, dim=-1).gather(-1, targets[..., None])[..., 0]
    picked = torch.where(mask != 0, logp, torch.zeros_like(logp))
    loss = -(mask.double() * picked).sum() / max(denom, 1)
    loss.backward()
    return loss.detach(), z.grad


def case(seed=0, batch=3, seq=7, vocab=41):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, seq, vocab, generator=gen) * 3
    targets = torch.randint(0, vocab, (batch, seq), generator=gen)
    mask = (torch.rand(batch, seq, generator=gen) > 0.3).float()
    return logits, targets, mask


def run(loss_fn, logits, targets, mask, denom):
    z = logits.clone().requires_grad_()
    loss, metrics = loss_fn(z, {"loss_mask": mask, "targets": targets}, denom)
    loss.backward()
    return loss.detach(), z.grad, metrics


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_value_and_gradient_match_the_float64_reference(temperature):
    logits, targets, mask = case()
    denom = int(mask.sum())
    loss, grad, metrics = run(NLLLossFn(temperature), logits, targets, mask, denom)
    ref, ref_grad = reference(logits, targets, mask, denom, temperature)
    torch.testing.assert_close(loss.double(), ref, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-7, rtol=1e-5)
    assert metrics["loss"] == loss and metrics["num_valid_tokens"] == denom


def test_microbatches_sum_to_the_whole_batch():
    logits, targets, mask = case(seed=1, batch=4)
    denom = int(mask.sum())
    whole, whole_grad, _ = run(NLLLossFn(), logits, targets, mask, denom)
    halves = [
        run(NLLLossFn(), logits[s], targets[s], mask[s], denom) for s in (slice(0, 2), slice(2, 4))
    ]
    torch.testing.assert_close(halves[0][0] + halves[1][0], whole)
    torch.testing.assert_close(torch.cat([halves[0][1], halves[1][1]]), whole_grad)


def test_masked_positions_add_nothing_whatever_target_they_hold():
    logits, targets, mask = case(seed=2)
    denom = int(mask.sum())
    expected, expected_grad, _ = run(NLLLossFn(), logits, targets, mask, denom)
    garbage = torch.where(mask != 0, targets, logits.shape[-1] + 5)  # an id beyond the vocabulary
    loss, grad, _ = run(NLLLossFn(), logits, garbage, mask, denom)
    assert torch.equal(loss, expected) and torch.equal(grad, expected_grad)
    assert not grad[mask == 0].any()


def test_shapes_are_checked():
    logits, targets, mask = case()
    with pytest.raises(ValueError, match="targets must be"):
        NLLLossFn()(logits, {"loss_mask": mask, "targets": targets[:, :-1]}, 1)
    with pytest.raises(ValueError, match="temperature"):
        NLLLossFn(0.0)
