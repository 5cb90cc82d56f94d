"""Plain-torch top-k KL: the CPU fallback and the reference the Triton kernel is tested against.

The same algorithm as the fused kernel (nemo_opd/ops/topk_kl_triton.py), in chunks of rows:

1. stats pass over the vocabulary, per row: the max m of s = z / tau, the sum-exp T over the
   whole (local) vocabulary and the sum-exp U over the ids outside the teacher's top-k S (both
   relative to m; U is summed directly over the non-S ids, so it is exact even when S holds
   nearly all the mass), and s gathered at S;
2. under tensor parallelism, all-reduces combine the shards (nemo_opd/distributed);
3. the per-row divergence over the buckets (nemo_opd/losses/divergence.py) as a function of
   s_S - m, log T and log U (log q_S = s_S - m - log T, log Q_tail = log U - log T); autograd
   on these [N, k] tensors gives dL/ds_S (direct), dL/dlog T and dL/dlog U;
4. gradient pass: since d log T / d s_j = q_j and d log U / d s_j = [j not in S] q_j / Q_tail,
       dL/dz_j = (1/tau) * ( q_j * (dL/dlog T + dL/dlog U / Q_tail)   for j not in S
                             dL/ds_j + q_j * dL/dlog T                  for j in S ).

The gradient is computed in forward (chunk by chunk, stored in the logits' dtype) and only
scaled by the incoming per-row gradient in backward, so memory stays bounded by one chunk of
fp32 temporaries plus the gradient itself. Deriving the per-row coefficients with autograd,
rather than with the closed forms written out in the kernel, makes this an independent check
of the kernel's hand-derived gradient.
"""

import torch
import torch.distributed as dist

from nemo_opd.distributed.collectives import all_reduce_vocab_stats
from nemo_opd.losses.divergence import (
    TopkKLParams,
    logsumexp_log1p,
    topk_divergence,
    weigh_gradient_coefficients,
)

CHUNK_ELEMENTS = 1 << 24
"""Row chunks hold about this many logits (64 MiB per fp32 temporary)."""


def _chunk_rows(vocab: int, chunk_rows: int | None) -> int:
    return chunk_rows if chunk_rows is not None else max(1, CHUNK_ELEMENTS // max(vocab, 1))


def _local_ids(indices: torch.Tensor, vocab_start: int, vocab: int):
    """(local ids clamped into range [N, k], mask of ids that fall in this shard [N, k])."""
    local = indices.long() - vocab_start
    owned = (local >= 0) & (local < vocab)
    return local.clamp(0, vocab - 1), owned


def _stats_pass(logits, local, owned, params, compute_dtype, chunk):
    """Pass 1 over row chunks: (row_max [N], sumexp [N, 2] = (T, U), s_S [N, k] (0 if unowned))."""
    n, vocab = logits.shape
    device = logits.device
    row_max = torch.empty(n, dtype=compute_dtype, device=device)
    sumexp = torch.zeros(n, 2, dtype=compute_dtype, device=device)
    s_topk = torch.empty(local.shape, dtype=compute_dtype, device=device)
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        s = logits[lo:hi].to(compute_dtype) / params.temperature
        # Finite even where the whole (local) row is -inf, a padded vocabulary shard: there
        # s - m stays -inf and the sums 0, where -inf - -inf would be NaN.
        m = s.amax(dim=-1).clamp_min(torch.finfo(compute_dtype).min)
        s_topk[lo:hi] = torch.where(owned[lo:hi], s.gather(1, local[lo:hi]), 0.0)
        e = s.sub_(m.unsqueeze(-1)).exp_()
        sumexp[lo:hi, 0] = e.sum(dim=-1)
        if params.tail == "bucket":
            rows = torch.arange(hi - lo, device=device).unsqueeze(-1).expand_as(local[lo:hi])
            own = owned[lo:hi]
            e[rows[own], local[lo:hi][own]] = 0.0
            sumexp[lo:hi, 1] = e.sum(dim=-1)
        row_max[lo:hi] = m
    return row_max, sumexp, s_topk


def _row_terms(row_max, sumexp, s_topk, teacher_logprobs, params, need_grad):
    """Per-row divergence, statistics and gradient coefficients from the combined stats.

    Log-probs are formed as (s - m) - log T, never through lse = m + log T, which would round
    to the precision of |m| (1e-3 for logits near 1e4).

    Returns (divergence [N], stats [N, 5], log_total [N], tail_coef [N], topk_grad [N, k])
    where the gradient of the divergence w.r.t. s_j is q_j * tail_coef for j outside S and
    topk_grad for j in S (the last two None when need_grad is False).
    """
    a = teacher_logprobs.to(s_topk.dtype)
    bucket = params.tail == "bucket"
    with torch.enable_grad():
        # bucket: log q_S = (s_S - m) - log T. renormalize: s_S itself (shift-invariant), as
        # s_S - m would lose the precision of s_S when the top-k lies far below the max.
        s_in = (s_topk - row_max.unsqueeze(-1)) if bucket else s_topk
        s_in = s_in.detach().requires_grad_(need_grad)
        log_total = torch.log(sumexp[:, 0]).requires_grad_(need_grad and bucket)
        log_tail = torch.log(sumexp[:, 1]).requires_grad_(need_grad and bucket)
        if bucket:
            logq_topk = s_in - log_total.unsqueeze(-1)
            terms = topk_divergence(logq_topk, log_tail - log_total, a, params)
        else:
            terms = topk_divergence(s_in, None, a, params)
        if need_grad:
            inputs = [s_in, log_total, log_tail] if bucket else [s_in]
            grads = torch.autograd.grad(terms.divergence.sum(), inputs)
    log_total = log_total.detach()
    stats = _row_stats(terms, a, s_topk, row_max, log_total)
    if not need_grad:
        return terms.divergence.detach(), stats, log_total, None, None
    inv_tau = 1.0 / params.temperature
    if bucket:
        d_s, d_total, d_tail = grads
        q_topk = torch.exp(s_in.detach() - log_total.unsqueeze(-1))
        # dL/dlog_tail / Q_tail (bounded: below the floor only the tail's weight Q_tail has a
        # gradient, and d_tail carries a factor Q_tail). fp64 keeps 1 / Q_tail finite for a
        # denormal Q_tail; a tail that underflowed to 0 gets no gradient.
        inv_q_tail = torch.exp((log_total - log_tail.detach()).double())
        tail_term = torch.where(d_tail != 0, d_tail.double() * inv_q_tail, 0.0)
        tail_coef = (d_total + tail_term.to(d_total.dtype)) * inv_tau
        topk_grad = (d_s + q_topk * d_total.unsqueeze(-1)) * inv_tau
    else:
        tail_coef = torch.zeros_like(log_total)
        topk_grad = grads[0] * inv_tau
    return terms.divergence.detach(), stats, log_total, tail_coef, topk_grad


def _row_stats(terms, a, s_topk, row_max, log_total):
    """[N, 5] statistics in the order of divergence.STAT_NAMES."""
    teacher_tail = torch.clamp(-torch.expm1(logsumexp_log1p(a)), min=0.0)
    log_mass = (torch.logsumexp(s_topk, dim=-1) - row_max) - log_total
    at_teacher_top1 = s_topk.gather(1, a.argmax(dim=-1, keepdim=True)).squeeze(-1)
    top1 = (at_teacher_top1 >= row_max).to(s_topk.dtype)
    fwd, rev = terms.forward_kl.detach(), terms.reverse_kl.detach()
    return torch.stack([fwd, rev, teacher_tail, log_mass.exp(), top1], dim=-1)


def _grad_pass(logits, grad, local, owned, row_max, log_total, tail_coef, topk_grad, params,
               chunk):  # fmt: skip
    """Pass 2 over row chunks: write dL/dz into `grad` (which may be `logits` itself)."""
    n = logits.shape[0]
    compute_dtype = log_total.dtype
    for lo in range(0, n, chunk):
        hi = min(lo + chunk, n)
        if params.tail == "bucket":
            s = logits[lo:hi].to(compute_dtype) / params.temperature
            s.sub_(row_max[lo:hi].unsqueeze(-1)).sub_(log_total[lo:hi].unsqueeze(-1))
            coef = tail_coef[lo:hi].unsqueeze(-1)
            # A row without gradient (weight 0) writes 0, even where its q is NaN.
            g = s.exp_().mul_(coef).masked_fill_(coef == 0, 0.0)
        else:
            g = torch.zeros(hi - lo, logits.shape[1], dtype=compute_dtype, device=logits.device)
        rows = torch.arange(hi - lo, device=logits.device).unsqueeze(-1).expand_as(local[lo:hi])
        own = owned[lo:hi]
        g[rows[own], local[lo:hi][own]] = topk_grad[lo:hi][own]
        grad[lo:hi].copy_(g)


def topk_kl_torch_forward(
    logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    params: TopkKLParams,
    *,
    vocab_start: int = 0,
    tp_group: dist.ProcessGroup | None = None,
    need_grad: bool = True,
    inplace_grad: bool = False,
    row_weights: torch.Tensor | None = None,
    chunk_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Divergence, statistics and (optionally) the gradient, in chunks of rows.

    Args:
        logits: [N, V_local] student logits (any float dtype), the shard starting at global
            id `vocab_start`.
        teacher_logprobs: [N, k] teacher top-k log-probs.
        teacher_indices: [N, k] global ids, distinct within a row.
        params: the divergence options.
        vocab_start, tp_group: the tensor-parallel shard and group (None: no sharding).
        need_grad: also compute d(divergence)/d(logits).
        inplace_grad: write the gradient into `logits` (destroys the logits; saves one
            [N, V_local] buffer).
        row_weights: optional [N]: the gradient returned is that of
            sum_n row_weights[n] * divergence[n] (the divergence itself is unweighted).
        chunk_rows: rows per chunk (default: about 2**24 logits per chunk).

    Returns:
        (divergence [N], stats [N, 5], grad [N, V_local] in the logits' dtype or None). The
        math is fp32 (fp64 for fp64 logits) and so are divergence and stats.
    """
    compute_dtype = torch.float64 if logits.dtype == torch.float64 else torch.float32
    chunk = _chunk_rows(logits.shape[1], chunk_rows)
    local, owned = _local_ids(teacher_indices, vocab_start, logits.shape[1])
    row_max, sumexp, s_topk = _stats_pass(logits, local, owned, params, compute_dtype, chunk)
    if tp_group is not None:
        row_max, sumexp, s_topk = all_reduce_vocab_stats(row_max, sumexp, s_topk, tp_group)
    s_topk = s_topk.masked_fill(teacher_indices < 0, float("-inf"))  # empty slots: Q = 0
    div, stats, log_total, tail_coef, topk_grad = _row_terms(
        row_max, sumexp, s_topk, teacher_logprobs, params, need_grad
    )
    if not need_grad:
        return div, stats, None
    if row_weights is not None:
        tail_coef, topk_grad = weigh_gradient_coefficients(tail_coef, topk_grad, row_weights)
    grad = logits if inplace_grad else torch.empty_like(logits)
    _grad_pass(logits, grad, local, owned, row_max, log_total, tail_coef, topk_grad, params, chunk)
    if inplace_grad:
        torch.autograd.graph.increment_version(logits)
    return div, stats, grad
