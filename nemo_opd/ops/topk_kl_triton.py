"""Fused top-k KL between a student's logits and a teacher's top-k log-probs (Triton).

Three kernels (plus a scaling kernel for backward), one row of logits per program for the
ones that stream over the vocabulary:

  stats  (pass 1 over the vocab): online max / sum-exp of s = z / tau, the sum-exp over the ids
         outside the teacher's top-k set S, and s gathered at S;
  rows   ([N, k] work, no vocab pass): the divergence, per-row statistics, and the gradient
         coefficients;
  grad   (pass 2 over the vocab): d(divergence)/d(logits), written during forward in the
         logits' dtype (optionally over the logits themselves).

Under tensor parallelism the host all-reduces the stats between the first two kernels
(nemo_opd/distributed/collectives.py); the rest is unchanged. The autograd Function shared
with the torch twin (nemo_opd/losses/topk_kl.py) only multiplies the stored gradient by the
incoming gradient in backward: per row for the divergence [N], or, for a weighted sum whose
weights were folded into the gradient in forward, by a scalar that the scaling kernel
(`scale_grad_`) reads on the device, skipping the pass when it is 1. No [N, V] fp32 tensor
is ever allocated: the extra memory is O(N * k) plus the gradient buffer (none with
inplace_grad).

Performance notes for the GPU (measured on an H200, docs/benchmarks.md): the vocab passes
read the logits in BLOCK_V-wide coalesced chunks (fp32 accumulation, one exp per logit per
pass); pass 1 takes the S part out of each block's sum with k-wide work, and marks S lanes with
block-wide compares only in the rare blocks where that subtraction would cancel. Block sizes
come from a plain heuristic (`_vocab_block`, set from a sweep on an H200), since
@triton.autotune does not run in the interpreter.

The math (docs/loss.md has the long form)
-----------------------------------------
Per row: s_j = z_j / tau, LSE = log sum_j e^{s_j}, q_j = e^{s_j - LSE}. Buckets b are the ids
of S and, for tail="bucket", one tail bucket t for every id outside S:

    bucket:      l_i = s_i - LSE (i in S),   Q_t = sum_{j not in S} q_j = U / T,
                 l_t = log max(Q_t, eps),    P_t = max(1 - sum_S e^{a_i}, 0),
                 lp_i = max(a_i, log eps),   lp_t = log max(P_t, eps)
    renormalize: l_i = s_i - log sum_S e^{s},  lp_i = max(a_i - log sum_S e^{a}, log eps)

with Q_b = e^{l_b} and P_b the unfloored masses (P_i = e^{a_i} or its renormalized value, 0
for an id the teacher rules out with a_i = -inf; the tail weights Q_t, P_t likewise). The
student's top-k logs l_i are never floored: the gradient that pulls up an id the teacher wants
must not vanish below the floor. T and U are sum-exps relative to the row max m; U is
accumulated over the non-S ids directly (never as T minus the S part), so Q_t keeps its
relative precision when S holds nearly all the mass.

Gradient. Write the divergence L as a function of the weights Q_b and the logs l_b, and let
G_b = Q_b dL/dQ_b + [l_b not floored] dL/dl_b. For i in S, d l_i / d s_j = [i = j] - Q_j
(Q = q in bucket mode, the renormalized Q otherwise); for the tail,
d Q_t / d s_j = [j not in S] q_j - Q_t q_j. Hence, with Gsum = sum_b G_b and R_t = G_t / Q_t,

    dL/ds_j = G_j - Q_j * Gsum           j in S
    dL/ds_j = q_j * (R_t - Gsum)         j not in S   (bucket; 0 for renormalize)
    dL/dz_j = dL/ds_j / tau

so one coefficient per row serves every id outside S, and only the k ids of S need their own
value. Any shift G_b -> G_b + c Q_b leaves both lines unchanged (sum_b Q_b = 1 and Q_j = q_j),
which removes the "+1" terms below. Per divergence (f = [Q_t < eps] marks a floored tail log):

    forward  L = sum_b P_b (lp_b - l_b):       G_i = -P_i,   R_t = -(1 - f) P_t / Q_t,
                                               Gsum = -(sum_S P_i + (1 - f) P_t)
    reverse  L = sum_b Q_b (l_b - lp_b):       G_i = Q_i (l_i - lp_i),   R_t = l_t - lp_t - f,
                                               Gsum = L - f Q_t
    mixed    w * forward + (1 - w) * reverse   (G, R_t, Gsum combine linearly)
    jsd      lm_b = log(beta P_b + (1 - beta) Q_b) from the floored logs,
             L = beta sum_b P_b (lp_b - lm_b) + (1 - beta) sum_b Q_b (l_b - lm_b);
             dL/dQ_b = (1 - beta)(l_b - lm_b) exactly (the other terms cancel because
             beta P_b + (1 - beta) Q_b = M_b), so G_b = (1 - beta) Q_b (l_b - lm_b),
             R_t = (1 - beta)(l_t - lm_t), Gsum = sum_S G_i + Q_t R_t.

The renormalize case is the same with no tail terms. Terms of order eps that appear when a
floor is active in jsd are dropped. The teacher's tail is computed as -expm1(logsumexp(a)) with
logsumexp(a) = max + log1p(sum of the others), so it keeps its relative precision as well;
log1p and expm1 are written out with short series for small arguments so that the result does
not depend on the accuracy of the hardware log near 1.
"""

import math

import torch
import torch.distributed as dist
import triton
import triton.language as tl

from nemo_opd.distributed.collectives import all_reduce_vocab_stats
from nemo_opd.losses.divergence import EPS, TopkKLParams, weigh_gradient_coefficients

_INDEX_SENTINEL = tl.constexpr(2**31 - 1)
_FLOAT32_LOWEST = tl.constexpr(-3.4028234663852886e38)
_SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@triton.jit
def _log1p(x):
    """log(1 + x) for x >= 0, accurate for small x whatever the precision of tl.log."""
    series = x * (1.0 - x * (0.5 - x * (1.0 / 3.0 - x * (0.25 - x * 0.2))))
    return tl.where(x < 0.01, series, tl.log(1.0 + x))


@triton.jit
def _expm1(x):
    """exp(x) - 1, accurate for small |x| whatever the precision of tl.exp."""
    series = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0)))))
    return tl.where(tl.abs(x) < 0.01, series, tl.exp(x) - 1.0)


@triton.jit
def _logaddexp(x, y):
    """log(e^x + e^y); either argument may be -inf (not both)."""
    hi = tl.maximum(x, y)
    return hi + tl.log(tl.exp(x - hi) + tl.exp(y - hi))


@triton.jit
def _topk_kl_stats_kernel(
    z_ptr,
    z_row_stride,
    idx_ptr,
    row_max_ptr,
    sumexp_ptr,
    s_topk_ptr,
    V,
    K,
    vocab_start,
    inv_tau,
    TAIL_BUCKET: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Pass 1. Per row: m = max_j s_j, T = sum_j e^{s_j - m}, U = sum_{j not in S} e^{s_j - m}
    over the local shard, and s at the ids of S owned by the shard (0 elsewhere). A shard row
    of -inf only gives m = the lowest finite float and T = U = 0.

    U block by block: the block's sum minus the part of its S ids (k lanes, not BLOCK_V), unless
    that part is over half the block's sum, where the subtraction would lose relative precision:
    then the block's non-S lanes are summed directly. idx_ptr holds the row's global ids sorted
    ascending, so a cursor started at the block's first id walks exactly the block's ids to mark
    their lanes. Blocks that hold most of their own mass in S are few (the student's top ids),
    so the block-wide marking, whose cost grows with k * BLOCK_V, is paid rarely.
    """
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_row_stride
    idx_row = idx_ptr + row * K

    cols = tl.arange(0, BLOCK_K)
    local = tl.load(idx_row + cols, mask=cols < K, other=-1) - vocab_start
    owned = (cols < K) & (local >= 0) & (local < V)
    z_topk = tl.load(z_row + local, mask=owned, other=0.0).to(tl.float32) * inv_tau
    tl.store(s_topk_ptr + row * K + cols, tl.where(owned, z_topk, 0.0), mask=cols < K)

    lanes = tl.arange(0, BLOCK_V)
    # The running max starts at the lowest finite value, not -inf: a block (or a whole shard)
    # of -inf logits, a masked or padded vocabulary, then gives e = 0 and alpha = 1 instead of
    # exp(-inf - -inf) = NaN, which the tensor-parallel all-reduce would spread to every rank.
    m = _FLOAT32_LOWEST
    total = 0.0
    tail = 0.0
    for v0 in range(0, V, BLOCK_V):
        offs = v0 + lanes
        x = tl.load(z_row + offs, mask=offs < V, other=float("-inf")).to(tl.float32) * inv_tau
        m_new = tl.maximum(m, tl.max(x, axis=0))
        e = tl.exp(x - m_new)
        alpha = tl.exp(m - m_new)
        block_sum = tl.sum(e, axis=0)
        total = total * alpha + block_sum
        if TAIL_BUCKET:
            in_block = owned & (local >= v0) & (local < v0 + BLOCK_V)
            s_part = tl.sum(tl.where(in_block, tl.exp(z_topk - m_new), 0.0), axis=0)
            block_tail = block_sum - s_part
            if s_part > 0.5 * block_sum:
                in_s = offs < 0
                cursor = tl.sum(((cols < K) & (local < v0)).to(tl.int32), axis=0)
                first = tl.load(idx_row + cursor, mask=cursor < K, other=_INDEX_SENTINEL)
                next_id = tl.where(cursor < K, first - vocab_start, _INDEX_SENTINEL)
                while next_id < v0 + BLOCK_V:
                    in_s = in_s | (offs == next_id)
                    cursor += 1
                    nxt = tl.load(idx_row + cursor, mask=cursor < K, other=_INDEX_SENTINEL)
                    next_id = tl.where(cursor < K, nxt - vocab_start, _INDEX_SENTINEL)
                block_tail = tl.sum(tl.where(in_s, 0.0, e), axis=0)
            tail = tail * alpha + block_tail
        m = m_new
    tl.store(row_max_ptr + row, m)
    tl.store(sumexp_ptr + 2 * row, total)
    tl.store(sumexp_ptr + 2 * row + 1, tail)


@triton.jit
def _topk_kl_rows_kernel(
    a_ptr,
    s_topk_ptr,
    row_max_ptr,
    sumexp_ptr,
    div_ptr,
    stats_ptr,
    tail_coef_ptr,
    topk_grad_ptr,
    N,
    K,
    inv_tau,
    w_forward,
    beta,
    log_beta,
    log_1m_beta,
    eps,
    JSD: tl.constexpr,
    TAIL_BUCKET: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Divergence, statistics and gradient coefficients for BLOCK_N rows (see the module doc).

    Writes div [N], stats [N, 5] (forward KL, reverse KL, teacher tail mass, student mass on
    S, top-1 agreement), tail_coef [N] = (R_t - Gsum) / tau and
    topk_grad [N, k] = (G_i - Q_i Gsum) / tau. Log-probs are formed as (x - max) - log(sum-exp): an
    explicit LSE = max + log(sum-exp) would round to the precision of |max| (1e-3 near 1e4).
    """
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK_K)
    row_ok = rows < N
    col_ok = cols[None, :] < K
    offs = rows.to(tl.int64)[:, None] * K + cols[None, :]
    ok = row_ok[:, None] & col_ok
    # Padding columns are -inf so they drop out of every max and sum-exp; rows past N are 0.
    a = tl.where(col_ok, tl.load(a_ptr + offs, mask=ok, other=0.0), float("-inf"))
    s = tl.where(col_ok, tl.load(s_topk_ptr + offs, mask=ok, other=0.0), float("-inf"))
    m = tl.load(row_max_ptr + rows, mask=row_ok, other=0.0)
    total = tl.load(sumexp_ptr + 2 * rows, mask=row_ok, other=1.0)
    tail = tl.load(sumexp_ptr + 2 * rows + 1, mask=row_ok, other=0.0)
    log_total = tl.log(total)

    # Empty slots (no id: s = -inf, set by the caller) drop out like the padding columns.
    filled = col_ok & (s > float("-inf"))

    # Teacher: log of its top-k mass as max + log1p(rest), and the tail mass. A row of -inf
    # (every slot empty) shifts by 0 instead, where -inf - -inf would be NaN.
    a_max = tl.max(a, axis=1)
    a_shift = tl.where(a_max > float("-inf"), a_max, 0.0)
    a_top1 = tl.argmax(a, axis=1)
    is_top1 = cols[None, :] == a_top1[:, None]
    rest = tl.sum(tl.where(is_top1, 0.0, tl.exp(a - a_shift[:, None])), axis=1)
    log_sum_a = _log1p(rest)  # log sum_S e^{a} = a_max + log_sum_a
    p_tail = tl.maximum(-_expm1(a_max + log_sum_a), 0.0)

    # Student, from s at S: log of its mass on S, and top-1 agreement with the teacher.
    s_max = tl.max(s, axis=1)
    s_shift = tl.where(s_max > float("-inf"), s_max, 0.0)
    log_sum_s = tl.log(tl.sum(tl.exp(s - s_shift[:, None]), axis=1))  # + s_shift: log sum_S e^s
    s_at_top1 = tl.sum(tl.where(is_top1, s, 0.0), axis=1)
    top1 = (s_at_top1 >= m).to(tl.float32)

    # From here on padding columns hold finite logs (0) and zero masses, so they add nothing.
    if TAIL_BUCKET:
        ell = tl.where(filled, (s - m[:, None]) - log_total[:, None], 0.0)
        teacher_log = a
        q_tail = tail / total
        ell_t = tl.log(tl.maximum(q_tail, eps))
        floored = (q_tail < eps).to(tl.float32)
        log_p_t = tl.log(tl.maximum(p_tail, eps))
    else:
        # Shifted by the top-k's own max, not by m: renormalizing is shift-invariant, and s - m
        # would lose the precision of s when the top-k lies far below the row max.
        ell = tl.where(filled, (s - s_shift[:, None]) - log_sum_s[:, None], 0.0)
        teacher_log = (a - a_shift[:, None]) - log_sum_a[:, None]
    q = tl.where(filled, tl.exp(ell), 0.0)
    # The teacher's logs are floored, its weights are not: an id it rules out (-inf) has P = 0.
    p = tl.where(filled, tl.exp(teacher_log), 0.0)
    log_p = tl.where(filled, tl.maximum(teacher_log, tl.log(eps)), 0.0)

    fwd = tl.sum(p * (log_p - ell), axis=1)
    rev = tl.sum(q * (ell - log_p), axis=1)
    if TAIL_BUCKET:
        fwd += p_tail * (log_p_t - ell_t)
        rev += q_tail * (ell_t - log_p_t)

    if JSD:
        log_m = _logaddexp(log_beta + log_p, log_1m_beta + ell)
        g_top = (1.0 - beta) * q * (ell - log_m)
        div = beta * tl.sum(p * (log_p - log_m), axis=1) + tl.sum(g_top, axis=1)
        g_sum = tl.sum(g_top, axis=1)
        if TAIL_BUCKET:
            log_m_t = _logaddexp(log_beta + log_p_t, log_1m_beta + ell_t)
            div += beta * p_tail * (log_p_t - log_m_t) + (1.0 - beta) * q_tail * (ell_t - log_m_t)
            r_tail = (1.0 - beta) * (ell_t - log_m_t)
            g_sum += q_tail * r_tail
    else:
        w_reverse = 1.0 - w_forward
        div = w_forward * fwd + w_reverse * rev
        g_top = w_reverse * q * (ell - log_p) - w_forward * p
        g_sum = w_reverse * rev - w_forward * tl.sum(p, axis=1)
        if TAIL_BUCKET:
            live = 1.0 - floored
            r_fwd = -live * p_tail / tl.maximum(q_tail, eps)
            r_tail = w_forward * r_fwd + w_reverse * (ell_t - log_p_t - floored)
            g_sum += -w_forward * live * p_tail - w_reverse * floored * q_tail

    student_topk_mass = tl.exp((s_shift - m) + (log_sum_s - log_total))
    tl.store(div_ptr + rows, div, mask=row_ok)
    tl.store(stats_ptr + 5 * rows, fwd, mask=row_ok)
    tl.store(stats_ptr + 5 * rows + 1, rev, mask=row_ok)
    tl.store(stats_ptr + 5 * rows + 2, p_tail, mask=row_ok)
    tl.store(stats_ptr + 5 * rows + 3, student_topk_mass, mask=row_ok)
    tl.store(stats_ptr + 5 * rows + 4, top1, mask=row_ok)
    tl.store(topk_grad_ptr + offs, (g_top - q * g_sum[:, None]) * inv_tau, mask=ok)
    if TAIL_BUCKET:
        tl.store(tail_coef_ptr + rows, (r_tail - g_sum) * inv_tau, mask=row_ok)
    else:
        tl.store(tail_coef_ptr + rows, tl.zeros_like(g_sum), mask=row_ok)


@triton.jit
def _topk_kl_grad_kernel(
    z_ptr,
    z_row_stride,
    g_ptr,
    g_row_stride,
    idx_ptr,
    row_max_ptr,
    sumexp_ptr,
    tail_coef_ptr,
    topk_grad_ptr,
    V,
    K,
    vocab_start,
    inv_tau,
    TAIL_BUCKET: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """Pass 2. g_j = q_j * tail_coef for every local id, then g_i = topk_grad_i at the owned
    ids of S. g_ptr may alias z_ptr: each lane reads its logit before overwriting it.
    """
    row = tl.program_id(0).to(tl.int64)
    z_row = z_ptr + row * z_row_stride
    g_row = g_ptr + row * g_row_stride
    lanes = tl.arange(0, BLOCK_V)
    if TAIL_BUCKET:
        m = tl.load(row_max_ptr + row)
        log_total = tl.log(tl.load(sumexp_ptr + 2 * row))
        coef = tl.load(tail_coef_ptr + row)
        for v0 in range(0, V, BLOCK_V):
            offs = v0 + lanes
            x = tl.load(z_row + offs, mask=offs < V, other=0.0).to(tl.float32) * inv_tau
            # A row without gradient (weight 0) writes 0, even where its q is NaN.
            g = tl.where(coef != 0.0, tl.exp((x - m) - log_total) * coef, 0.0)
            tl.store(g_row + offs, g.to(g_ptr.dtype.element_ty), mask=offs < V)
    else:
        for v0 in range(0, V, BLOCK_V):
            offs = v0 + lanes
            zero = tl.zeros([BLOCK_V], dtype=g_ptr.dtype.element_ty)
            tl.store(g_row + offs, zero, mask=offs < V)
    # The S ids were written above by other threads of this program: order the stores.
    tl.debug_barrier()
    cols = tl.arange(0, BLOCK_K)
    local = tl.load(idx_ptr + row * K + cols, mask=cols < K, other=-1) - vocab_start
    owned = (cols < K) & (local >= 0) & (local < V)
    g_topk = tl.load(topk_grad_ptr + row * K + cols, mask=owned, other=0.0)
    tl.store(g_row + local, g_topk.to(g_ptr.dtype.element_ty), mask=owned)


@triton.jit
def _scale_rows_kernel(g_ptr, g_row_stride, scale_ptr, V, BLOCK_V: tl.constexpr):
    """g *= scale, with scale a device scalar. When it is exactly 1 (a plain loss.backward()
    of a weighted sum) nothing is read or written, and the host never had to look."""
    row = tl.program_id(0).to(tl.int64)
    scale = tl.load(scale_ptr)
    if scale != 1.0:
        g_row = g_ptr + row * g_row_stride
        for v0 in range(0, V, BLOCK_V):
            offs = v0 + tl.arange(0, BLOCK_V)
            g = tl.load(g_row + offs, mask=offs < V).to(tl.float32) * scale
            tl.store(g_row + offs, g.to(g_ptr.dtype.element_ty), mask=offs < V)


def kernels_interpreted() -> bool:
    """True when this module's kernels were built by Triton's interpreter (TRITON_INTERPRET=1
    was set before triton was imported): they then run on CPU tensors."""
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(_topk_kl_stats_kernel, InterpretedFunction)


def _check_runnable(logits: torch.Tensor) -> None:
    if logits.device.type != "cuda" and not kernels_interpreted():
        raise RuntimeError(
            "The Triton top-k KL kernel got tensors on "
            f"{logits.device.type!r}: off CUDA it runs only under Triton's interpreter, and "
            "TRITON_INTERPRET=1 must be set before triton is first imported (here triton was "
            "imported without it). Export TRITON_INTERPRET=1 before starting Python, or use "
            'implementation="torch".'
        )
    if logits.dtype not in _SUPPORTED_DTYPES:
        raise ValueError(
            f"the Triton kernel takes float16, bfloat16 or float32 logits, got {logits.dtype}"
        )
    if logits.stride(-1) != 1:
        raise ValueError("the Triton kernel needs logits contiguous along the vocab dim")


def _vocab_block(vocab: int, block_v: int | None, tail_bucket: bool = False) -> tuple[int, int]:
    """(BLOCK_V, num_warps) of the vocabulary passes: 8,192 logits per step with 8 warps, the
    fastest of a sweep on an H200 at V = 151,936 for either tail (docs/benchmarks.md)."""
    del tail_bucket  # the same block for both tails since pass 1 marks S lanes only rarely
    block = block_v if block_v is not None else min(8192, triton.next_power_of_2(vocab))
    return block, (8 if block >= 2048 else 4)


def topk_kl_triton_forward(
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
    block_v: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Divergence, statistics and (optionally) the gradient with the fused kernels.

    Args:
        logits: [N, V_local] fp16/bf16/fp32 student logits, contiguous along the vocab; the
            shard starting at global id `vocab_start`.
        teacher_logprobs: [N, k] teacher top-k log-probs.
        teacher_indices: [N, k] global ids, distinct within a row.
        params: the divergence options.
        vocab_start, tp_group: the tensor-parallel shard and group (None: no sharding).
        need_grad: also compute d(divergence)/d(logits).
        inplace_grad: write the gradient over `logits` (destroys them; saves N * V_local
            elements of memory).
        row_weights: optional [N] fp32: the gradient returned is that of
            sum_n row_weights[n] * divergence[n] (the divergence itself is unweighted).
        block_v: logits per vocab step (a power of two; default: a heuristic).

    Returns:
        (divergence [N] fp32, stats [N, 5] fp32, grad [N, V_local] in the logits' dtype or
        None).
    """
    _check_runnable(logits)
    n, vocab = logits.shape
    k = teacher_indices.shape[1]
    device = logits.device
    f32 = torch.float32
    div = torch.empty(n, dtype=f32, device=device)
    stats = torch.empty(n, 5, dtype=f32, device=device)
    if n == 0:
        return div, stats, (torch.empty_like(logits) if need_grad else None)

    # Sorted ids let pass 1 find a block's S lanes with a cursor; the buckets' order is free.
    sorted_ids, order = torch.sort(teacher_indices, dim=-1)
    sorted_ids = sorted_ids.to(torch.int32).contiguous()
    a = teacher_logprobs.to(f32).gather(1, order).contiguous()
    tail_bucket = params.tail == "bucket"
    block, num_warps = _vocab_block(vocab, block_v, tail_bucket)
    block_k = triton.next_power_of_2(k)
    inv_tau = 1.0 / params.temperature

    row_max = torch.empty(n, dtype=f32, device=device)
    sumexp = torch.empty(n, 2, dtype=f32, device=device)
    s_topk = torch.empty(n, k, dtype=f32, device=device)
    _topk_kl_stats_kernel[(n,)](
        logits, logits.stride(0), sorted_ids, row_max, sumexp, s_topk, vocab, k, vocab_start,
        inv_tau, TAIL_BUCKET=tail_bucket, BLOCK_V=block, BLOCK_K=block_k, num_warps=num_warps,
    )  # fmt: skip
    if tp_group is not None:
        row_max, sumexp, s_topk = all_reduce_vocab_stats(row_max, sumexp, s_topk, tp_group)
    s_topk.masked_fill_(sorted_ids < 0, float("-inf"))  # empty slots: Q = 0

    tail_coef = torch.empty(n, dtype=f32, device=device)
    topk_grad = torch.empty(n, k, dtype=f32, device=device)
    w_forward = {"forward": 1.0, "reverse": 0.0}.get(params.kl_type, params.mixed_kl_weight)
    beta = params.jsd_beta
    block_n = max(1, min(64, 2048 // block_k))
    _topk_kl_rows_kernel[(triton.cdiv(n, block_n),)](
        a, s_topk, row_max, sumexp, div, stats, tail_coef, topk_grad, n, k, inv_tau,
        w_forward, beta, math.log(beta) if beta > 0 else -math.inf,
        math.log1p(-beta) if beta < 1 else -math.inf, EPS, JSD=params.kl_type == "jsd",
        TAIL_BUCKET=tail_bucket, BLOCK_N=block_n, BLOCK_K=block_k, num_warps=4,
    )  # fmt: skip
    if not need_grad:
        return div, stats, None
    if row_weights is not None:
        tail_coef, topk_grad = weigh_gradient_coefficients(tail_coef, topk_grad, row_weights)

    grad = logits if inplace_grad else torch.empty_like(logits)
    _topk_kl_grad_kernel[(n,)](
        logits, logits.stride(0), grad, grad.stride(0), sorted_ids, row_max, sumexp, tail_coef,
        topk_grad, vocab, k, vocab_start, inv_tau, TAIL_BUCKET=tail_bucket, BLOCK_V=block,
        BLOCK_K=block_k, num_warps=num_warps,
    )  # fmt: skip
    if inplace_grad:
        # Triton's writes are invisible to autograd: let it detect later uses of the logits.
        torch.autograd.graph.increment_version(logits)
    return div, stats, grad


def scale_grad_(grad: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """grad *= scale (a 0-d device tensor) in place; free when scale == 1. The backward of a
    weighted sum (nemo_opd.losses.topk_kl.TopkKLFunction) calls it."""
    block, num_warps = _vocab_block(grad.shape[1], None)
    scale = scale.detach().reshape(1).to(torch.float32)
    _scale_rows_kernel[(grad.shape[0],)](
        grad, grad.stride(0), scale, grad.shape[1], BLOCK_V=block, num_warps=num_warps
    )
    return grad
