"""A scoring answer under trained_only crosses from a worker to the driver as the trained
positions' values alone, and the driver puts them back where they were (trained_positions.py);
Policy.score's answers through other processes are checked in the layout tests
(layout_runs.assert_trained_only_scores)."""

import pytest
import torch
from tiny_policies import make_batch, policy_config, running_policy

from nemo_opd.losses import build_loss_mask
from nemo_opd.policy.trained_positions import packed, trained_positions, unpacked


def dense_answer(batch: dict, k: int = 4, hidden: int = 8) -> dict:
    """A dense answer of every kind and dtype, random everywhere."""
    gen = torch.Generator().manual_seed(5)
    b, s = batch["input_ids"].shape
    return {
        "topk_logprobs": torch.randn(b, s, k, generator=gen),
        "topk_indices": torch.randint(0, 100, (b, s, k), generator=gen, dtype=torch.int32),
        "logprobs": torch.randn(b, s, generator=gen),
        "hidden_states": torch.randn(b, s, hidden, generator=gen).to(torch.bfloat16),
    }


def test_packing_keeps_the_loss_masks_positions_and_puts_them_back():
    batch = make_batch(6, seed=2)
    answer = dense_answer(batch)
    where = build_loss_mask(batch["token_mask"]) != 0
    assert torch.equal(trained_positions(batch["token_mask"]), where)
    sent = packed(answer, batch["token_mask"])
    n = int(where.sum())
    assert 0 < n < where.numel()
    for name, value in answer.items():
        assert sent[name].shape == (n, *value.shape[2:])
        assert sent[name].dtype == value.dtype
    back = unpacked(sent, batch["token_mask"])
    for name, value in answer.items():
        mask = where.reshape(*where.shape, *[1] * (value.dim() - 2))
        assert torch.equal(back[name], torch.where(mask, value, torch.zeros_like(value)))


def test_an_answer_unpacked_on_other_rows_is_refused():
    sent = packed(dense_answer(make_batch(4, seed=1)), make_batch(4, seed=1)["token_mask"])
    other = make_batch(4, seed=9)["token_mask"]
    assert int(trained_positions(other).sum()) != sent["logprobs"].shape[0]
    with pytest.raises(ValueError, match="logprobs: .* packed positions for rows with"):
        unpacked(sent, other)


def test_a_worker_sends_the_trained_positions_only(model_dirs):
    """What PolicyWorker.score returns (what a process boundary carries) holds the trained
    positions alone, and Policy.score rebuilds score's full answer from it."""
    batch = make_batch(5, seed=4)
    where = trained_positions(batch["token_mask"])
    with running_policy(policy_config(model_dirs["tied"]), 1, optimizer=False) as policy:
        [worker] = policy.workers.workers
        sent = worker.score(batch, 3, 1.0, True, True, trained_only=True)
        full = policy.score(batch, topk=3, logprobs=True, hidden=True)
        trained = policy.score(batch, topk=3, logprobs=True, hidden=True, trained_only=True)
    n = int(where.sum())
    assert sent["topk_logprobs"].shape == (n, 3) and sent["logprobs"].shape == (n,)
    assert sent["hidden_states"].shape[0] == n
    for name, value in full.items():
        mask = where.reshape(*where.shape, *[1] * (value.dim() - 2))
        expected = torch.where(mask, value, torch.zeros_like(value))
        torch.testing.assert_close(trained[name], expected, rtol=1e-5, atol=1e-6)
