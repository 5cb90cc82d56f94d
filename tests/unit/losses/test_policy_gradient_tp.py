"""Tensor parallelism: PolicyGradientLossFn on a vocabulary split across 2 gloo processes
gives the single-process loss, metrics and gradient, with and without the top-k term."""

import math

import torch
import torch.distributed as dist
from forked_ranks import run_ranks
from topk_kl_testing import make_case

from nemo_opd.losses import DistillationLossFn, PolicyGradientLossFn, TopkKLParams

WORLD = 2
B, S, K = 3, 5, 6
VOCAB, SPLIT = 301, 140  # uneven shards [0, 140) and [140, 301); id 300 is -inf padding


def _batch():
    """Logits [B, S, VOCAB] (bf16: the loss casts) and the loss's fields, including the
    teacher's top-k over the real ids 0..299."""
    logits, teacher_logprobs, teacher_ids = make_case(B * S, VOCAB - 1, K, seed=11)
    logits = torch.cat([logits, torch.full((B * S, 1), -math.inf)], dim=1)
    logits[4, SPLIT:] = -math.inf  # a row with rank 1's whole shard at -inf ...
    teacher_ids[4] = torch.arange(K)  # ... where the teacher's ids have finite student logits
    logits[7, 250] = 40.0  # a row whose max is on rank 1
    gen = torch.Generator().manual_seed(12)
    targets = torch.randint(0, VOCAB - 1, (B, S), generator=gen)
    targets.view(-1)[4] = 3  # on rank 0, the shard with finite logits in that row
    targets[0, :2] = torch.tensor([SPLIT - 1, SPLIT])  # the ids either side of the split
    logp = torch.log_softmax(logits.double() / 0.9, -1).view(B, S, VOCAB)
    logp = logp.gather(-1, targets[..., None]).squeeze(-1)
    old = logp - (torch.rand(B, S, generator=gen, dtype=torch.float64) * 2 - 1)  # r in [e-1, e]
    loss_mask = torch.ones(B, S)
    loss_mask[1, 2:] = 0.0
    data = {
        "targets": targets,
        "old_logprobs": old.float(),
        "sampler_logprobs": (old + torch.randn(B, S, generator=gen) * 0.8).float(),
        "advantages": torch.randn(B, S, generator=gen),
        "loss_mask": loss_mask,
        "teacher_topk_logprobs": teacher_logprobs.view(B, S, K),
        "teacher_topk_indices": teacher_ids.view(B, S, K),
    }
    return logits.to(torch.bfloat16).view(B, S, VOCAB), data


def _loss_fns():
    distill = DistillationLossFn(params=TopkKLParams(temperature=0.7), implementation="torch")
    return {
        "pg": PolicyGradientLossFn(temperature=0.9, clip_eps_high=0.28),
        "hybrid": PolicyGradientLossFn(temperature=0.9, topk_kl=distill, topk_kl_coef=0.4),
    }


def _run(loss_fn, logits, data, **shard):
    z = logits.detach().clone().requires_grad_()
    loss, metrics = loss_fn(z, data, 14, **shard)
    (loss * 1.3).backward()
    return loss.detach(), metrics, z.grad


def _worker(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=WORLD)
    try:
        logits, data = _batch()
        lo, hi = (0, SPLIT) if rank == 0 else (SPLIT, VOCAB)
        for name, loss_fn in _loss_fns().items():
            label = f"{name}, rank {rank}"
            full_loss, full_metrics, full_grad = _run(loss_fn, logits, data)
            loss, metrics, grad = _run(
                loss_fn, logits[..., lo:hi], data, vocab_start=lo, tp_group=dist.group.WORLD
            )
            torch.testing.assert_close(loss, full_loss, atol=1e-6, rtol=1e-5, msg=label)
            torch.testing.assert_close(metrics, full_metrics, atol=1e-6, rtol=1e-5, msg=label)
            torch.testing.assert_close(grad, full_grad[..., lo:hi], msg=label)
            assert torch.isfinite(grad).all(), label
            assert full_metrics["clip_fraction"] > 0, label  # the clip is exercised
            assert full_metrics["is_truncated_fraction"] > 0, label
            assert ("topk_loss" in metrics) == (name == "hybrid"), label
    finally:
        dist.destroy_process_group()


def test_vocab_parallel_equals_single_process(tmp_path):
    # A failed assertion in either child raises here.
    run_ranks(_worker, WORLD, str(tmp_path / "store"), env={"OMP_NUM_THREADS": "1"})
