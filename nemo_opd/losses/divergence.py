"""The divergence between teacher and student over the top-k buckets (docs/loss.md).

Everything here works on per-row quantities of size [N, k] or [N]: the student's log-probs at
the teacher's top-k ids and its log tail mass, and the teacher's top-k log-probs. How those
student quantities are obtained from the [N, V] logits (a fused kernel, a chunked torch pass,
a full log_softmax) is the business of the callers. The functions are differentiable, so a
caller can obtain the gradient of the divergence with respect to the per-row statistics with
autograd on tensors that are k times smaller than the logits.
"""

import math
from dataclasses import dataclass
from typing import Literal

import torch

EPS = 1e-12
"""Floor of the masses inside logarithms: every teacher bucket's and the student's tail."""

KL_TYPES = ("forward", "reverse", "mixed", "jsd")
TAILS = ("bucket", "renormalize")
KLType = Literal["forward", "reverse", "mixed", "jsd"]
Tail = Literal["bucket", "renormalize"]

STAT_NAMES = (
    "forward_kl",
    "reverse_kl",
    "teacher_tail_mass",
    "student_topk_mass",
    "top1_agreement",
)
"""Columns of the per-row statistics [N, 5] that both implementations return."""


@dataclass(frozen=True)
class TopkKLParams:
    """The divergence options of `topk_kl`, validated.

    jsd at jsd_beta 0 or 1 is TRL's generalized JSD at its endpoints, which TRL defines as the
    forward KL(P || Q) and the reverse KL(Q || P) (the divergence itself vanishes there): such
    params become kl_type "forward" / "reverse", so every implementation computes exactly the
    KL. Use dataclasses.replace to change a field, so this is applied again.
    """

    kl_type: KLType = "reverse"
    mixed_kl_weight: float = 0.5
    jsd_beta: float = 0.5
    tail: Tail = "bucket"
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.kl_type not in KL_TYPES:
            raise ValueError(f"kl_type must be one of {KL_TYPES}, got {self.kl_type!r}")
        if self.tail not in TAILS:
            raise ValueError(f"tail must be one of {TAILS}, got {self.tail!r}")
        if not 0.0 <= self.mixed_kl_weight <= 1.0:
            raise ValueError(f"mixed_kl_weight must be in [0, 1], got {self.mixed_kl_weight}")
        if not 0.0 <= self.jsd_beta <= 1.0:
            raise ValueError(f"jsd_beta must be in [0, 1], got {self.jsd_beta}")
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise ValueError(f"temperature must be a positive number, got {self.temperature}")
        if self.kl_type == "jsd" and self.jsd_beta in (0.0, 1.0):
            object.__setattr__(self, "kl_type", "forward" if self.jsd_beta == 0.0 else "reverse")


DEFAULT_PARAMS = TopkKLParams()
"""Reverse KL over the tail bucket at temperature 1 (w = beta = 0.5 where they apply)."""


def logsumexp_log1p(x: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, accurate when one term dominates.

    Computed as max + log1p(sum of the other terms), so that a teacher whose top-k holds
    1 - 1e-9 of the mass still gets a tail mass -expm1(lse) with full relative precision.
    x: [..., k] -> [...].
    """
    top, arg = x.max(dim=-1, keepdim=True)
    shift = top.masked_fill(top == -math.inf, 0.0)  # all -inf (no term): the sum is -inf
    rest = torch.exp(x - shift).scatter(-1, arg, 0.0).sum(dim=-1)
    return top.squeeze(-1) + torch.log1p(rest)


def teacher_tail_mass(teacher_logprobs: torch.Tensor) -> torch.Tensor:
    """P_tail = max(1 - sum_S exp(a), 0), in log1p/expm1 form. [..., k] -> [...]."""
    return torch.clamp(-torch.expm1(logsumexp_log1p(teacher_logprobs)), min=0.0)


def weigh_gradient_coefficients(
    tail_coef: torch.Tensor, topk_grad: torch.Tensor, row_weights: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The coefficients of the gradient of sum_n row_weights[n] * divergence[n]: tail_coef [N]
    and topk_grad [N, k] times the weights, exactly 0 in the rows of weight 0 even where the
    coefficients are NaN or inf (a padded position with garbage logits or teacher)."""
    keep = row_weights != 0
    weighted_tail = torch.where(keep, tail_coef * row_weights, 0.0)
    weighted_topk = torch.where(keep.unsqueeze(-1), topk_grad * row_weights.unsqueeze(-1), 0.0)
    return weighted_tail, weighted_topk


@dataclass(frozen=True)
class Divergences:
    """Per-row divergences over the buckets: the one asked for and both KLs (for metrics)."""

    divergence: torch.Tensor
    forward_kl: torch.Tensor
    reverse_kl: torch.Tensor


def topk_divergence(
    student_logq_topk: torch.Tensor,
    student_logq_tail: torch.Tensor | None,
    teacher_logprobs: torch.Tensor,
    params: TopkKLParams,
) -> Divergences:
    """The divergence between teacher and student over the buckets of `params.tail`.

    Args:
        student_logq_topk: [N, k] the student's log-probs at the teacher's top-k ids. For
            tail="renormalize" any per-row shift is allowed (they are renormalized over S).
        student_logq_tail: [N] the student's log tail mass log(1 - sum_S q) (may be -inf;
            floored at log EPS inside logarithms); required for tail="bucket", else ignored.
        teacher_logprobs: [N, k] the teacher's log-probs at its top-k ids (-inf for an id it
            rules out; at least one finite with tail="renormalize").
        params: kl_type, mixed_kl_weight, jsd_beta, tail (temperature is not used here).

    Returns:
        Divergences of shape [N] each, in the dtype of the inputs; differentiable with
        respect to both student inputs.
    """
    a = teacher_logprobs.to(student_logq_topk.dtype)
    if params.tail == "bucket":
        if student_logq_tail is None:
            raise ValueError('tail="bucket" needs the student log tail mass')
        p_tail = teacher_tail_mass(a)
        teacher_logs = torch.cat([a, torch.log(p_tail).unsqueeze(-1)], dim=-1)
        p = torch.cat([a.exp(), p_tail.unsqueeze(-1)], dim=-1)
        log_q_tail = student_logq_tail.clamp_min(math.log(EPS))
        log_q = torch.cat([student_logq_topk, log_q_tail.unsqueeze(-1)], dim=-1)
        # The tail weight is the unfloored mass: a vanishing tail contributes 0 * log(0 / x).
        q = torch.cat([student_logq_topk.exp(), student_logq_tail.exp().unsqueeze(-1)], dim=-1)
    else:
        teacher_logs = torch.log_softmax(a, dim=-1)
        p = teacher_logs.exp()
        log_q = torch.log_softmax(student_logq_topk, dim=-1)
        q = log_q.exp()
    # Every teacher bucket's log is floored, its weight is not: an id the teacher rules out
    # (log-prob -inf) contributes 0 * log(0 / x) = 0 to the forward KL and a finite penalty
    # to the reverse KL. The student's top-k logs are not floored, or a token the teacher
    # wants could not be pulled up from below the floor.
    log_p = teacher_logs.clamp_min(math.log(EPS))
    # An empty slot (the student's log-prob -inf: no id) is no bucket: both weights 0 and
    # both logs a finite stand-in, so that it adds exactly 0 and passes no gradient.
    filled = student_logq_topk > -math.inf
    if params.tail == "bucket":  # the tail bucket is always there
        filled = torch.cat([filled, torch.ones_like(filled[..., :1])], dim=-1)
    p, q = p.where(filled, 0.0), q.where(filled, 0.0)
    log_p, log_q = log_p.where(filled, 0.0), log_q.where(filled, 0.0)

    forward_kl = (p * (log_p - log_q)).sum(-1)
    reverse_kl = (q * (log_q - log_p)).sum(-1)
    if params.kl_type == "forward":
        div = forward_kl
    elif params.kl_type == "reverse":
        div = reverse_kl
    elif params.kl_type == "mixed":
        w = params.mixed_kl_weight
        div = w * forward_kl + (1.0 - w) * reverse_kl
    else:
        beta = params.jsd_beta
        log_beta = math.log(beta) if beta > 0 else -math.inf
        log_1m_beta = math.log1p(-beta) if beta < 1 else -math.inf
        log_m = torch.logaddexp(log_p + log_beta, log_q + log_1m_beta)
        div = beta * (p * (log_p - log_m)).sum(-1) + (1.0 - beta) * (q * (log_q - log_m)).sum(-1)
    return Divergences(div, forward_kl, reverse_kl)
