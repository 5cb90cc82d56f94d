"""Tensor parallelism: the vocabulary split across 2 gloo processes gives the tp=1 answer.

Both implementations run in the same two spawned processes (the Triton kernel in Triton's
interpreter when there is no GPU: the children start with TRITON_INTERPRET=1).
"""

import math

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from topk_kl_testing import KL_SWEEP, TAIL_SWEEP, make_case, run_impl

from nemo_opd.losses import DistillationLossFn, TopkKLParams

WORLD = 2
VOCAB, SPLIT = 301, 140  # uneven shards: [0, 140) and [140, 301)


def _shard_run(implementation, logits, logprobs, ids, grad_out, rank, **options):
    lo, hi = (0, SPLIT) if rank == 0 else (SPLIT, VOCAB)
    return run_impl(
        implementation,
        logits[:, lo:hi],
        logprobs,
        ids,
        grad_out,
        vocab_start=lo,
        tp_group=dist.group.WORLD,
        **options,
    ), (lo, hi)


def _worker(rank, init_file, implementations):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        logits, logprobs, ids = make_case(8, VOCAB, 9, dtype=torch.bfloat16, seed=3)
        ids[0] = torch.arange(9)  # a row whose top-k lies entirely in shard 0
        ids[1] = torch.arange(VOCAB - 9, VOCAB)  # ... and one entirely in shard 1
        logits[2, 200] = 40.0  # the row max on shard 1
        # Rows whose whole shard on one rank is -inf (a padding shard): that rank's max must
        # not turn into NaN, which the all-reduce would spread to every rank.
        ids[6], logits[6, :SPLIT] = torch.arange(200, 209), -math.inf
        ids[7], logits[7, SPLIT:] = torch.arange(20, 29), -math.inf
        # empty slots (a teacher mapped from another vocabulary): owned by no shard
        ids[3, 4:], logprobs[3, 4:] = -1, -math.inf
        ids[4, :], logprobs[4, :] = -1, -math.inf
        grad_out = torch.linspace(-1.0, 2.0, 8)
        for implementation in implementations:
            for kl_type in KL_SWEEP:
                for tail in TAIL_SWEEP:
                    options = dict(kl_type=kl_type, tail=tail, temperature=0.8)
                    full = run_impl(implementation, logits, logprobs, ids, grad_out, **options)
                    (div, stats, grad), (lo, hi) = _shard_run(
                        implementation, logits, logprobs, ids, grad_out, rank, **options
                    )
                    label = f"{implementation} {kl_type} {tail} rank {rank}"
                    torch.testing.assert_close(div, full[0], atol=2e-6, rtol=1e-5, msg=label)
                    for got, want in zip(stats, full[1], strict=True):
                        torch.testing.assert_close(got, want, atol=2e-6, rtol=1e-5, msg=label)
                    torch.testing.assert_close(
                        grad.float(), full[2][:, lo:hi].float(), atol=1e-5, rtol=1e-2, msg=label
                    )
                    assert torch.isfinite(div).all() and torch.isfinite(grad).all(), label
                    assert grad[logits[:, lo:hi] == -math.inf].eq(0).all(), label
            # The training loss on a vocab shard equals the unsharded one.
            data = {
                "teacher_topk_logprobs": logprobs.view(2, 4, 9),
                "teacher_topk_indices": ids.view(2, 4, 9),
                "token_mask": torch.tensor([[1, 1, 1, 1], [1, 0, 1, 1]]),
            }
            mixed = TopkKLParams(kl_type="mixed")
            loss_fn = DistillationLossFn(params=mixed, implementation=implementation)
            full_loss, full_metrics = loss_fn(logits.view(2, 4, VOCAB), data, 5)
            lo, hi = (0, SPLIT) if rank == 0 else (SPLIT, VOCAB)
            shard = logits.view(2, 4, VOCAB)[..., lo:hi]
            loss, metrics = loss_fn(shard, data, 5, vocab_start=lo, tp_group=dist.group.WORLD)
            torch.testing.assert_close(loss, full_loss)
            torch.testing.assert_close(metrics, full_metrics)
    finally:
        dist.destroy_process_group()


@pytest.mark.timeout(600)
def test_vocab_parallel_equals_single_process(tmp_path, monkeypatch):
    implementations = ["torch", "triton"]
    if not torch.cuda.is_available():
        # The children import triton afresh; this makes their kernels run in the interpreter.
        monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    # A failed assertion in either child makes spawn raise here.
    mp.spawn(_worker, args=(str(tmp_path / "store"), implementations), nprocs=WORLD, join=True)
