"""Log-probs and top-k over vocab-parallel logits, without full-vocabulary fp32 logits.

Each tensor-parallel rank holds logits [N, V_local] for global ids vocab_start..+V_local.
Rows are processed in chunks; per chunk the shard is cast to fp32, its max and sum-exp are
combined across ranks (collectives.all_reduce_vocab_stats), and top-k candidates are taken
locally, all-gathered and reduced to the global top-k.

Columns at -inf (a padded vocabulary's padding) get no probability; a shard may be -inf
entirely (it contributes nothing), as long as some shard has a finite logit in every row.
"""

import torch
import torch.distributed as dist

from nemo_opd.distributed.collectives import all_reduce_vocab_stats

DEFAULT_CHUNK_ROWS = 1024


def _is_parallel(group: dist.ProcessGroup | None) -> bool:
    return group is not None and dist.get_world_size(group) > 1


def _logsumexp_and_owned(
    logits: torch.Tensor, owned: torch.Tensor | None, group: dist.ProcessGroup | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Full-vocabulary logsumexp [n] of fp32 shard logits [n, V_local], and `owned` summed."""
    row_max = logits.max(dim=-1).values
    # A row that is -inf on this whole shard has a sum-exp of 0: shift it by 0, not by its max
    # (-inf - -inf is NaN). Its max stays -inf, so the combined max comes from other shards.
    shift = torch.where(torch.isfinite(row_max), row_max, 0.0)
    sumexp = torch.exp(logits - shift.unsqueeze(-1)).sum(dim=-1, keepdim=True)
    if _is_parallel(group):
        row_max, sumexp, owned = all_reduce_vocab_stats(row_max, sumexp, owned, group)
    return row_max + sumexp.squeeze(-1).log(), owned


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
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    vocab_local = logits.shape[-1]
    for start in range(0, logits.shape[0], chunk_rows):
        rows = slice(start, start + chunk_rows)
        chunk = logits[rows].float()
        local = targets[rows].long() - vocab_start
        inside = (local >= 0) & (local < vocab_local)
        picked = chunk.gather(-1, local.clamp(0, vocab_local - 1).unsqueeze(-1))
        picked = torch.where(inside.unsqueeze(-1), picked, 0.0)
        lse, picked = _logsumexp_and_owned(chunk, picked, group)
        out[rows] = picked.squeeze(-1) - lse
    return out


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
