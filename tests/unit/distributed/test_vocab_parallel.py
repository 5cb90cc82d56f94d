"""Log-probs and top-k over a padded vocabulary split across 2 gloo processes equal a
single-process log_softmax over the real columns, also when one shard is all padding; the
differentiable log-probs match float64 autograd, and under tp=2 the single-process run."""

import math

import pytest
import torch
import torch.distributed as dist
from forked_ranks import run_ranks

from nemo_opd.distributed.vocab_parallel import (
    vocab_parallel_logprobs,
    vocab_parallel_logprobs_with_grad,
    vocab_parallel_topk,
)

WORLD = 2
ROWS, K = 7, 5
VOCABS = (
    301,  # padded to 512: rank 1 holds ids 256..300 and 211 padding columns
    100,  # padded to 256: rank 1's shard (ids 128..255) is padding only
)


def _worker(rank: int, init_file: str, cases: list) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        for vocab, shards, starts, targets, expected in cases:
            shard, start = shards[rank], starts[rank]
            logprobs = vocab_parallel_logprobs(shard, targets, start, dist.group.WORLD)
            values, ids = vocab_parallel_topk(shard, K, start, dist.group.WORLD)
            ref_logprobs, ref_values, ref_ids = expected
            label = f"vocab {vocab}, rank {rank}"
            torch.testing.assert_close(logprobs, ref_logprobs, msg=label)
            torch.testing.assert_close(values, ref_values, msg=label)
            assert torch.equal(ids.long(), ref_ids), f"{label}: top-k ids differ"
    finally:
        dist.destroy_process_group()


def _case(vocab: int) -> tuple:
    """(vocab, each rank's masked shard, each rank's first id, targets, reference outputs)."""
    from nemo_opd.policy.engines.vocab_padding import mask_padded_logits, padded_vocab_size

    padded = padded_vocab_size(vocab, WORLD)
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randn(ROWS, padded, generator=gen) * 4  # garbage in the padding columns
    logits[0, vocab - 1] = 30.0  # a row whose maximum is the last real id
    targets = torch.randint(0, vocab, (ROWS,), generator=gen)
    width = padded // WORLD
    starts = [rank * width for rank in range(WORLD)]
    shards = [mask_padded_logits(logits[:, s : s + width], s, vocab) for s in starts]
    reference = torch.log_softmax(logits[:, :vocab], dim=-1)
    expected = (reference.gather(1, targets[:, None]).squeeze(1), *reference.topk(K, dim=-1))
    return vocab, shards, starts, targets, expected


def test_padded_vocabulary_matches_single_process(tmp_path):
    # The shards are built here: the forked workers only compute with vocab_parallel.
    cases = [_case(vocab) for vocab in VOCABS]
    run_ranks(_worker, WORLD, str(tmp_path / "init"), cases)


# vocab_parallel_logprobs_with_grad: values and gradients.

GRAD_ROWS, GRAD_VOCAB, GRAD_SPLIT = 37, 301, 140  # uneven shards: [0, 140) and [140, 301)
PAD_COLUMN, PAD_ROW = 300, 5  # a -inf column everywhere; a row all -inf on rank 1's shard
GRAD_TOL = {  # (values, gradients) against float64; the gradient is stored in the logits' dtype
    torch.float32: (dict(atol=2e-6, rtol=1e-6), dict(atol=1e-7, rtol=1e-5)),
    torch.bfloat16: (dict(atol=2e-6, rtol=1e-6), dict(atol=1e-7, rtol=8e-3)),
}


def _grad_case(dtype: torch.dtype, seed: int = 0) -> tuple:
    """(logits [N, V] in dtype, targets [N], upstream gradient [N] with a 0 and negatives)."""
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(GRAD_ROWS, GRAD_VOCAB, generator=gen) * 3).to(dtype)
    logits[:, PAD_COLUMN] = -math.inf
    logits[PAD_ROW, GRAD_SPLIT:] = -math.inf
    logits[2, 250] = 60.0  # a row whose max is on rank 1's shard, far above the rest
    targets = torch.randint(0, GRAD_VOCAB - 1, (GRAD_ROWS,), generator=gen)
    targets[PAD_ROW] = 7
    targets[3], targets[4] = 0, GRAD_VOCAB - 2  # each shard's first and last real column
    grad_out = torch.randn(GRAD_ROWS, generator=gen)
    grad_out[1] = 0.0
    return logits, targets, grad_out


def _with_grad(logits, targets, grad_out, vocab_start=0, group=None, chunk_rows=8):
    z = logits.detach().clone().requires_grad_()
    values = vocab_parallel_logprobs_with_grad(z, targets, vocab_start, group, chunk_rows)
    values.backward(grad_out)
    return values.detach(), z.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_logprobs_with_grad_match_float64_autograd(dtype):
    logits, targets, grad_out = _grad_case(dtype)
    values, grad = _with_grad(logits, targets, grad_out)
    z = logits.double().requires_grad_()
    reference = torch.log_softmax(z, dim=-1).gather(1, targets[:, None]).squeeze(1)
    reference.backward(grad_out.double())
    value_tol, grad_tol = GRAD_TOL[dtype]
    assert values.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(values, reference.float(), **value_tol)
    torch.testing.assert_close(grad.double(), z.grad, **grad_tol)
    assert torch.isfinite(grad).all()
    assert grad[:, PAD_COLUMN].eq(0).all() and grad[PAD_ROW, GRAD_SPLIT:].eq(0).all()
    # The values are vocab_parallel_logprobs' values.
    torch.testing.assert_close(values, vocab_parallel_logprobs(logits, targets), atol=0, rtol=0)


def _grad_worker(rank: int, init_file: str, cases: list) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        lo, hi = (0, GRAD_SPLIT) if rank == 0 else (GRAD_SPLIT, GRAD_VOCAB)
        for logits, targets, grad_out, (want_values, want_grad) in cases:
            values, grad = _with_grad(
                logits[:, lo:hi], targets, grad_out, lo, dist.group.WORLD, chunk_rows=16
            )
            label = f"{logits.dtype}, rank {rank}"
            torch.testing.assert_close(values, want_values, atol=1e-6, rtol=1e-6, msg=label)
            torch.testing.assert_close(grad, want_grad[:, lo:hi], msg=label)
            assert torch.isfinite(grad).all(), label
    finally:
        dist.destroy_process_group()


def test_logprobs_with_grad_tp2_equal_single_process(tmp_path):
    cases = []
    for dtype in (torch.float32, torch.bfloat16):
        logits, targets, grad_out = _grad_case(dtype, seed=1)
        cases.append((logits, targets, grad_out, _with_grad(logits, targets, grad_out)))
    run_ranks(_grad_worker, WORLD, str(tmp_path / "init"), cases)
