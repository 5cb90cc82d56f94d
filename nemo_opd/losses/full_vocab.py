"""Exact divergences over the full vocabulary, from the student's and the teacher's logits.

The top-k loss (topk_kl.py) sees the teacher through its k most likely ids and one tail
bucket. Where the teacher's own logits are at hand (the student computes them from the
teacher's final hidden states with the teacher's LM head, chunk by chunk: losses/chunked_head.py
and docs/loss.md), the divergence can be taken over every id instead: with
log q = log_softmax(z / tau) and log p = log_softmax(z_T / tau), both over the full vocabulary,

    forward  KL(p || q) = sum_v p_v (log p_v - log q_v)
    reverse  KL(q || p) = sum_v q_v (log q_v - log p_v)
    mixed    w * forward + (1 - w) * reverse
    jsd      beta * KL(p || m) + (1 - beta) * KL(q || m),  m = beta p + (1 - beta) q

which is the top-k divergence with S = the whole vocabulary (no tail). The teacher's logs are
floored at log EPS as in the top-k loss, the student's are not; an id the student rules out
(its logit -inf: a padded vocabulary's padding) is no bucket on either side.

Gradient. For any L(q), dL/ds_v = G_v - q_v sum_u G_u with G_v = q_v dL/dq_v (s = z / tau):
    forward  G = -p        reverse  G = q (log q - log p)
    mixed    w (-p) + (1 - w) q (log q - log p)        jsd  G = (1 - beta) q (log q - log m)
It is computed during forward, row block by row block, in the logits' dtype (only a block's
fp32 temporaries are ever alive: never [N, V] in fp32), and backward scales it by the incoming
gradient, as the top-k loss does. Under tensor parallelism each rank holds a vocabulary shard
of both logits; the row statistics (logsumexps, the sums above) are combined over the group.
"""

import math
from typing import NamedTuple

import torch
import torch.distributed as dist

from nemo_opd.distributed.collectives import all_reduce_vocab_stats
from nemo_opd.losses.divergence import EPS, TopkKLParams
from nemo_opd.losses.teacher_logits import TeacherLogits

BLOCK_ELEMENTS = 2**22
"""fp32 elements per row block (16 MiB per temporary); a block holds at most six of them."""


class FullVocabStats(NamedTuple):
    """Per-position statistics [N] fp32, named as the top-k loss's (TopkKLStats)."""

    forward_kl: torch.Tensor
    reverse_kl: torch.Tensor
    top1_agreement: torch.Tensor
    """1.0 where the student's largest logit is at the teacher's most likely id (ties count)."""


def full_vocab_kl_weighted_sum(
    student_logits: torch.Tensor,
    teacher_logits: torch.Tensor | TeacherLogits,
    weights: torch.Tensor,
    *,
    params: TopkKLParams,
    teacher_temperature: float | None = None,
    tp_group: dist.ProcessGroup | None = None,
) -> tuple[torch.Tensor, FullVocabStats]:
    """sum(weights * divergence) over the full vocabulary, with per-position statistics.

    Args:
        student_logits: [..., V_local] (differentiable): the student's logits, or this rank's
            vocabulary shard of them.
        teacher_logits: [..., V_local] the teacher's logits over the same ids (no gradient): a
            tensor, or a TeacherLogits that makes them block by block.
        weights: [...] per-position weights (e.g. loss_mask / global_valid_toks); a weight of
            0 contributes nothing, even where the logits are not finite.
        params: kl_type, mixed_kl_weight, jsd_beta and temperature (the student's: its logits
            are divided by it; tail does not apply).
        teacher_temperature: the teacher's logits are divided by it (None: params.temperature).
        tp_group: the tensor-parallel group of the vocabulary shards (None: the whole
            vocabulary is here).

    Returns:
        (the weighted sum, a scalar whose gradient reaches student_logits; the statistics,
        shaped like the positions).
    """
    if student_logits.shape != teacher_logits.shape:
        raise ValueError(
            f"student and teacher logits must have one shape, got {tuple(student_logits.shape)} "
            f"and {tuple(teacher_logits.shape)}"
        )
    if weights.shape != student_logits.shape[:-1]:
        raise ValueError(
            f"weights must have the positions' shape {tuple(student_logits.shape[:-1])}, "
            f"got {tuple(weights.shape)}"
        )
    lead, vocab = student_logits.shape[:-1], student_logits.shape[-1]
    student = student_logits.reshape(-1, vocab)
    teacher = TeacherLogits.of(teacher_logits)
    row_weights = weights.reshape(-1).to(torch.float32)
    tau_t = params.temperature if teacher_temperature is None else teacher_temperature
    total, stats = _FullVocabKL.apply(student, teacher, row_weights, params, tau_t, tp_group)
    return total, FullVocabStats(*(column.reshape(lead) for column in stats.unbind(-1)))


class _FullVocabKL(torch.autograd.Function):
    """forward(student [N, V], teacher (TeacherLogits of [N, V]), row_weights [N], params,
    teacher_temperature, tp_group) ->
    (sum of row_weights * divergence, stats [N, 3]); the gradient is formed in forward."""

    @staticmethod
    def forward(ctx, student, teacher, row_weights, params, teacher_temperature, tp_group):
        divergence, stats, grad = full_vocab_forward(
            student, teacher, row_weights, params, teacher_temperature, tp_group,
            need_grad=student.requires_grad,
        )  # fmt: skip
        ctx.mark_non_differentiable(stats)
        ctx.stored_grad = grad
        keep = row_weights != 0
        return torch.where(keep, divergence * row_weights, 0.0).sum(), stats

    @staticmethod
    def backward(ctx, grad_total, grad_stats):
        grad, ctx.stored_grad = ctx.stored_grad, None
        if grad is None:
            raise RuntimeError("the full-vocabulary loss's gradient was already consumed")
        return grad.mul_(grad_total.to(grad.dtype)), None, None, None, None, None


def full_vocab_forward(
    student: torch.Tensor,
    teacher: TeacherLogits,
    row_weights: torch.Tensor,
    params: TopkKLParams,
    teacher_temperature: float,
    tp_group: dist.ProcessGroup | None = None,
    *,
    need_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The divergence [N] fp32, the statistics [N, 3] (forward_kl, reverse_kl,
    top1_agreement) and, with need_grad, d(sum row_weights * divergence)/d(student) [N, V] in
    the student's dtype (0 in rows of weight 0), block by block of rows."""
    n, vocab = student.shape
    divergence = torch.zeros(n, dtype=torch.float32, device=student.device)
    stats = torch.zeros(n, 3, dtype=torch.float32, device=student.device)
    grad = torch.zeros_like(student) if need_grad else None
    rows_per_block = max(1, BLOCK_ELEMENTS // max(vocab, 1))
    # Whether any id is ruled out (a padded vocabulary's -inf): asked once, not per block (on a
    # GPU each answer waits for the device).
    rules_out = not bool(torch.isfinite(student.detach()).all())
    for start in range(0, n, rows_per_block):
        rows = slice(start, min(start + rows_per_block, n))
        teacher_rows = teacher.rows(rows.start, rows.stop)
        block = _Block(
            student[rows].detach(), teacher_rows, params, teacher_temperature, tp_group, rules_out
        )
        divergence[rows] = block.divergence
        stats[rows, 0], stats[rows, 1] = block.forward_kl, block.reverse_kl
        stats[rows, 2] = _top1_agreement(student[rows].detach(), teacher_rows, tp_group)
        if grad is not None:
            grad[rows] = block.gradient(row_weights[rows])
    return divergence, stats, grad


class _Block:
    """One block of rows: both log-softmaxes over the full vocabulary and the divergence, in
    as few passes over the block's [R, V_local] as the formulas allow (each pass reads or
    writes R x V_local fp32: the block's time is its passes). rules_out: whether the student
    may rule ids out (logits that are not finite) anywhere in the call's rows."""

    def __init__(
        self, student, teacher, params: TopkKLParams, teacher_temperature, group, rules_out
    ):
        self.params, self.group = params, group
        self.log_q = _log_softmax(_scaled(student, params.temperature), group)
        self.log_p = _log_softmax(_scaled(teacher, teacher_temperature), group)
        self.q = self.log_q.exp()
        self.p = self.log_p.exp()
        self.log_p.clamp_min_(math.log(EPS))
        if rules_out:  # an id the student rules out is no bucket: weights and logs made 0
            absent = ~torch.isfinite(self.log_q)
            for tensor in (self.log_p, self.log_q, self.p):
                tensor.masked_fill_(absent, 0.0)
        self.diff = self.log_q - self.log_p
        self.forward_kl = -_row_sum(self.p * self.diff, group)
        self.reverse_kl = _row_sum(self.q * self.diff, group)
        if params.kl_type == "jsd":
            beta = params.jsd_beta
            self.log_m = torch.logaddexp(
                self.log_p + math.log(beta), self.log_q + math.log1p(-beta)
            )
            to_p = _row_sum(self.p * (self.log_p - self.log_m), group)
            to_q = _row_sum(self.q * (self.log_q - self.log_m), group)
            self.divergence = beta * to_p + (1.0 - beta) * to_q
        else:
            w = _forward_weight(params)
            self.divergence = w * self.forward_kl + (1.0 - w) * self.reverse_kl

    def gradient(self, row_weights: torch.Tensor) -> torch.Tensor:
        """d(sum row_weights * divergence)/d(logits) of the block [R, V_local], fp32: 0 in
        rows of weight 0, whatever their logits."""
        grad = self._unscaled_gradient()
        scale = torch.where(row_weights != 0, row_weights / self.params.temperature, 0.0)
        grad.mul_(scale.unsqueeze(-1))
        grad[scale == 0] = 0.0
        return grad

    def _unscaled_gradient(self) -> torch.Tensor:
        """G - q sum(G) [R, V_local] fp32, G as in the module docstring (a new tensor)."""
        params, q = self.params, self.q
        if params.kl_type == "jsd":
            g = (1.0 - params.jsd_beta) * q * (self.log_q - self.log_m)
        else:
            w = _forward_weight(params)
            if w == 1.0:  # G = -p, so G - q sum(G) = q sum(p) - p
                return (q * _row_sum(self.p, self.group).unsqueeze(-1)).sub_(self.p)
            g = q * self.diff if w == 0.0 else (q * self.diff).mul_(1.0 - w).sub_(self.p, alpha=w)
        return g.sub_(q * _row_sum(g, self.group).unsqueeze(-1))


def _forward_weight(params: TopkKLParams) -> float:
    """The forward KL's weight w in w * forward + (1 - w) * reverse (kl_type not jsd)."""
    return {"forward": 1.0, "reverse": 0.0}.get(params.kl_type, params.mixed_kl_weight)


def _scaled(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """logits / temperature in fp32 (the logits themselves when already so at temperature 1:
    nothing writes into them)."""
    x = logits.float()
    return x if temperature == 1.0 else x / temperature


def _is_parallel(group: dist.ProcessGroup | None) -> bool:
    return group is not None and dist.get_world_size(group) > 1


def _log_softmax(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """log_softmax over the full vocabulary of fp32 shard rows [R, V_local], as a new tensor."""
    row_max = x.max(dim=-1).values
    shift = torch.where(torch.isfinite(row_max), row_max, torch.finfo(torch.float32).min)
    shifted = x - shift.unsqueeze(-1)
    sumexp = shifted.exp().sum(dim=-1, keepdim=True)
    if _is_parallel(group):
        global_shift, sumexp, _ = all_reduce_vocab_stats(shift, sumexp, None, group)
        shifted.sub_((global_shift - shift).unsqueeze(-1))
    return shifted.sub_(sumexp.log())


def _row_sum(x: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """Per-row sum over the full vocabulary of shard rows [R, V_local] -> [R]."""
    total = x.sum(dim=-1)
    if _is_parallel(group):
        dist.all_reduce(total, group=group)
    return total


def _top1_agreement(student, teacher, group) -> torch.Tensor:
    """1.0 where the student's logit at the teacher's argmax equals the student's max [R]."""
    s_max, _ = student.float().max(dim=-1)
    t_max, t_arg = teacher.float().max(dim=-1)
    s_at = student.float().gather(-1, t_arg.unsqueeze(-1)).squeeze(-1)
    if _is_parallel(group):
        global_t_max = t_max.clone()
        dist.all_reduce(global_t_max, op=dist.ReduceOp.MAX, group=group)
        s_at = torch.where(t_max == global_t_max, s_at, -math.inf)
        for value in (s_max, s_at):
            dist.all_reduce(value, op=dist.ReduceOp.MAX, group=group)
    return (s_at >= s_max).float()


@torch.no_grad()
def teacher_logprobs_at(
    teacher_logits: torch.Tensor | TeacherLogits,
    ids: torch.Tensor,
    vocab_start: int,
    temperature: float,
    tp_group: dist.ProcessGroup | None = None,
) -> torch.Tensor:
    """log_softmax(teacher_logits / temperature) over the full vocabulary at global ids.

    Args:
        teacher_logits: [N, V_local] this rank's shard (first global id vocab_start): a tensor
            or a TeacherLogits.
        ids: [N, k] global ids (each owned by exactly one shard).

    Returns:
        [N, k] fp32 log-probs (-inf where the teacher rules an id out).
    """
    teacher = TeacherLogits.of(teacher_logits)
    n, vocab = ids.shape[0], teacher.shape[-1]
    out = torch.empty(ids.shape, dtype=torch.float32, device=ids.device)
    rows_per_block = max(1, BLOCK_ELEMENTS // max(vocab, 1))
    for start in range(0, n, rows_per_block):
        rows = slice(start, min(start + rows_per_block, n))
        x = teacher.rows(rows.start, rows.stop).float() / temperature
        local = ids[rows].long() - vocab_start
        owned = (local >= 0) & (local < vocab)
        picked = torch.where(owned, x.gather(-1, local.clamp(0, vocab - 1)), 0.0)
        row_max = x.max(dim=-1).values
        shift = torch.where(torch.isfinite(row_max), row_max, torch.finfo(torch.float32).min)
        sumexp = torch.exp(x - shift.unsqueeze(-1)).sum(dim=-1, keepdim=True)
        if _is_parallel(tp_group):
            shift, sumexp, picked = all_reduce_vocab_stats(shift, sumexp, picked, tp_group)
        out[rows] = (picked - shift.unsqueeze(-1)) - sumexp.log()
    return out
