"""Log-probs and top-k over vocab-parallel logits, without full-vocabulary fp32 logits.

Each tensor-parallel rank holds logits [N, V_local] for global ids vocab_start..+V_local.
Rows are processed in chunks; per chunk the shard is cast to fp32, its max and sum-exp are
combined across ranks (collectives.all_reduce_vocab_stats), and top-k candidates are taken
locally, all-gathered and reduced to the global top-k.

Columns at -inf (a padded vocabulary's padding) get no probability; a shard may be -inf
entirely (it contributes nothing), as long as some shard has a finite logit in every row.

`vocab_parallel_logprobs` is for scoring (no gradient); `vocab_parallel_logprobs_with_grad` is
the same forward under a custom autograd Function whose backward needs no collective: the
gradient of log softmax(z)[y] is onehot(y) - softmax(z), and each rank's columns of it follow
from its own shard and the global per-row statistics saved in forward.
"""

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from nemo_opd.distributed.collectives import all_reduce_vocab_stats

DEFAULT_CHUNK_ROWS = 1024


def _is_parallel(group: dist.ProcessGroup | None) -> bool:
    return group is not None and dist.get_world_size(group) > 1


def _max_and_log_sumexp(
    logits: torch.Tensor, owned: torch.Tensor | None, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Full-vocabulary row max [n] and log sum exp(logits - max) [n] of fp32 shard logits
    [n, V_local] (their sum is the logsumexp), and `owned` summed over the group."""
    row_max = logits.max(dim=-1).values
    # A row that is -inf on this whole shard has a sum-exp of 0: shift it by 0, not by its max
    # (-inf - -inf is NaN). Its max stays -inf, so the combined max comes from other shards.
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    sumexp = torch.exp(logits - shift.unsqueeze(-1)).sum(dim=-1, keepdim=True)
    if _is_parallel(group):
        row_max, sumexp, owned = all_reduce_vocab_stats(row_max, sumexp, owned, group)
    return row_max, sumexp.squeeze(-1).log(), owned


def _logsumexp_and_owned(
    logits: torch.Tensor, owned: torch.Tensor | None, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full-vocabulary logsumexp [n] of fp32 shard logits [n, V_local], and `owned` summed."""
    row_max, log_sumexp, owned = _max_and_log_sumexp(logits, owned, group)
    return row_max + log_sumexp, owned


def _local_target(targets: torch.Tensor, vocab_start: int, vocab_local: int):
    """(column of each target in the local shard, clamped into it [n, 1]; whether it is there
    [n, 1])."""
    local = targets.long() - vocab_start
    inside = (local >= 0) & (local < vocab_local)
    return local.clamp(0, vocab_local - 1).unsqueeze(-1), inside.unsqueeze(-1)


def _logprobs_and_stats(logits, targets, vocab_start, group, chunk_rows):
    """log softmax(logits)[target] [N] fp32, with the global row max [N] and log sum-exp [N]
    it was normalized by."""
    n, vocab_local = logits.shape
    logprobs, row_maxes, log_sumexps = (
        torch.empty(n, dtype=torch.float32, device=logits.device) for _ in range(3)
    )
    for start in range(0, n, chunk_rows):
        rows = slice(start, start + chunk_rows)
        chunk = logits[rows].float()
        column, inside = _local_target(targets[rows], vocab_start, vocab_local)
        picked = torch.where(inside, chunk.gather(-1, column), 0.0)
        row_max, log_sumexp, picked = _max_and_log_sumexp(chunk, picked, group)
        # (z - max) - log sum-exp, not z - lse: the rounding of a large lse would be kept.
        logprobs[rows] = (picked.squeeze(-1) - row_max) - log_sumexp
        row_maxes[rows] = row_max
        log_sumexps[rows] = log_sumexp
    return logprobs, row_maxes, log_sumexps


def vocab_parallel_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """log softmax(logits)[target] over the full vocabulary.

    Args:
        logits: [N, V_local] (any float dtype).
        targets: [N] global token ids.

    Returns:
        [N] fp32 log-probs.
    """
    return _logprobs_and_stats(logits, targets, vocab_start, group, chunk_rows)[0]


class VocabParallelLogprobs(torch.autograd.Function):
    """log softmax(logits)[target] over a vocab-parallel vocabulary, differentiable in logits.

    Forward combines each row's max and sum-exp over the group (two all-reduces per chunk of
    rows) and saves them. Backward is local: with p = softmax over the full vocabulary,

        d logp / d z_j = [j = target] - p_j,   p_j = exp((z_j - max) - log sum-exp),

    so a rank computes its own columns from its shard and the saved statistics. A -inf column
    has p_j = 0 and gets gradient 0. The math is fp32; the gradient has the logits' dtype.
    """

    @staticmethod
    def forward(ctx, logits, targets, vocab_start, group, chunk_rows):
        logprobs, row_max, log_sumexp = _logprobs_and_stats(
            logits, targets, vocab_start, group, chunk_rows
        )
        ctx.save_for_backward(logits, targets, row_max, log_sumexp)
        ctx.vocab_start, ctx.chunk_rows = vocab_start, chunk_rows
        return logprobs

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_logprobs):
        logits, targets, row_max, log_sumexp = ctx.saved_tensors
        n, vocab_local = logits.shape
        grad = torch.empty_like(logits)
        for start in range(0, n, ctx.chunk_rows):
            rows = slice(start, start + ctx.chunk_rows)
            # A new fp32 tensor even for fp32 logits: the saved logits must stay intact.
            probs = logits[rows].float() - row_max[rows].unsqueeze(-1)
            probs = probs.sub_(log_sumexp[rows].unsqueeze(-1)).exp_()
            scale = grad_logprobs[rows].float().unsqueeze(-1)
            chunk_grad = probs.mul_(-scale)
            column, inside = _local_target(targets[rows], ctx.vocab_start, vocab_local)
            chunk_grad.scatter_add_(-1, column, torch.where(inside, scale, 0.0))
            grad[rows] = chunk_grad
        return grad, None, None, None, None


def vocab_parallel_logprobs_with_grad(
    logits: torch.Tensor,
    targets: torch.Tensor,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> torch.Tensor:
    """log softmax(logits)[target] over the full vocabulary, with a gradient w.r.t. logits.

    The values equal `vocab_parallel_logprobs`. Each rank's logits get the gradient of its own
    columns; backward runs no collective (see VocabParallelLogprobs).

    Args:
        logits: [N, V_local] (any float dtype; math in fp32), global ids vocab_start..
            vocab_start + V_local; -inf columns allowed, and a whole shard of -inf in a row as
            long as another rank has a finite logit there.
        targets: [N] global token ids.
        vocab_start, group: the tensor-parallel vocab shard and group.

    Returns:
        [N] fp32 log-probs.
    """
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(
            f"logits must be [N, V_local] and targets [N]; got {tuple(logits.shape)} and "
            f"{tuple(targets.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be a float tensor, got {logits.dtype}")
    return VocabParallelLogprobs.apply(logits, targets, vocab_start, group, chunk_rows)


def vocab_parallel_topk(
    logits: torch.Tensor,
    k: int,
    vocab_start: int = 0,
    group: dist.ProcessGroup | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest log-probs (normalized over the full vocabulary) and their global ids.

    Args:
        logits: [N, V_local].
        k: at most the global vocabulary size.

    Returns:
        (log-probs [N, k] fp32 sorted descending, global ids [N, k] int32).
    """
    n, vocab_local = logits.shape
    tp = dist.get_world_size(group) if _is_parallel(group) else 1
    if k > vocab_local * tp:
        raise ValueError(f"k={k} exceeds the vocabulary size {vocab_local * tp}")
    values = torch.empty(n, k, dtype=torch.float32, device=logits.device)
    indices = torch.empty(n, k, dtype=torch.int32, device=logits.device)
    local_k = min(k, vocab_local)
    for start in range(0, n, chunk_rows):
        rows = slice(start, start + chunk_rows)
        chunk = logits[rows].float()
        top_val, top_idx = chunk.topk(local_k, dim=-1)
        top_idx = top_idx + vocab_start
        if tp > 1:
            top_val, top_idx = _merge_candidates(top_val, top_idx, k, group)
        lse, _ = _logsumexp_and_owned(chunk, None, group)
        values[rows] = top_val - lse.unsqueeze(-1)
        indices[rows] = top_idx.to(torch.int32)
    return values, indices


def _merge_candidates(values, indices, k, group):
    """All-gather every rank's [n, k_local] candidates and keep the global top-k."""
    world = dist.get_world_size(group)
    all_values = [torch.empty_like(values) for _ in range(world)]
    all_indices = [torch.empty_like(indices) for _ in range(world)]
    dist.all_gather(all_values, values.contiguous(), group=group)
    dist.all_gather(all_indices, indices.contiguous(), group=group)
    values, where = torch.cat(all_values, dim=-1).topk(k, dim=-1)
    return values, torch.cat(all_indices, dim=-1).gather(-1, where)
