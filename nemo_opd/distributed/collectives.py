"""Collectives: all_reduce skipped over a group of one rank, and the combination of per-row
statistics computed on vocab-parallel logit shards.

Under tensor parallelism each rank holds the logits of a contiguous slice of the vocabulary.
A softmax over the full vocabulary needs, per row, the global max and the global sum of
exp(logit - max); values gathered at global token ids live on exactly one rank each. These
helpers combine such statistics with two all-reduces and no host synchronization.
"""

import torch
import torch.distributed as dist


def all_reduce_vocab_stats(
    row_max: torch.Tensor,
    sumexp: torch.Tensor,
    owned: torch.Tensor | None = None,
    group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Combine per-shard softmax statistics into full-vocabulary ones.

    Args:
        row_max: [N] fp32, the max of the local shard's (scaled) logits per row; finite (the
            lowest float where a shard's row is all -inf, its sums then 0), so that no
            -inf - -inf reaches the rescaling.
        sumexp: [N, C] fp32, C sums of exp(x - row_max) over (subsets of) the local shard.
        owned: optional [N, K] fp32 values where each entry is nonzero on at most one rank
            (values gathered at global ids, 0 where the id is not in the local shard).
        group: the tensor-parallel process group.

    Returns:
        (global_max [N], global_sumexp [N, C] relative to global_max, owned summed over ranks).
        The inputs are not modified.
    """
    global_max = row_max.clone()
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    rescaled = sumexp * torch.exp(row_max - global_max).unsqueeze(-1)
    num_sums = sumexp.shape[-1]
    packed = rescaled if owned is None else torch.cat([rescaled, owned], dim=-1)
    dist.all_reduce(packed, op=dist.ReduceOp.SUM, group=group)
    if owned is None:
        return global_max, packed, None
    return global_max, packed[:, :num_sums].contiguous(), packed[:, num_sums:].contiguous()


def all_reduce(
    tensor: torch.Tensor, group: dist.ProcessGroup, op: dist.ReduceOp = dist.ReduceOp.SUM
) -> None:
    """dist.all_reduce in place, skipped over a group of one rank (where it is the identity but
    still a round trip through the backend, several per microbatch)."""
    if dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, op=op, group=group)
