"""`topk_kl`: the per-position divergence between a student and a teacher's top-k (functional).

The exact semantics are in docs/loss.md. Two implementations compute them: the fused Triton
kernel (nemo_opd/ops/topk_kl_triton.py) and a chunked plain-torch twin
(nemo_opd/losses/topk_kl_torch.py). Both compute the gradient during forward; one autograd
Function (`TopkKLFunction`) serves both and only scales that gradient in backward.
"""

import functools
from collections.abc import Callable
from typing import Any, Literal, NamedTuple

import torch
import torch.distributed as dist

from nemo_opd.losses.checks import (
    check_topk_kl_inputs,
    global_vocab_size,
    validate_teacher_topk,
)
from nemo_opd.losses.divergence import DEFAULT_PARAMS, KLType, Tail, TopkKLParams

Implementation = Literal["auto", "triton", "torch"]
IMPLEMENTATIONS = ("auto", "triton", "torch")


class TopkKLStats(NamedTuple):
    """Per-position statistics for metrics, each of the positions' shape [...], fp32.

    Computed alongside the divergence without extra passes over the vocabulary.
    """

    forward_kl: torch.Tensor
    """KL(P || Q) over the buckets of the chosen tail mode."""
    reverse_kl: torch.Tensor
    """KL(Q || P) over the same buckets."""
    teacher_tail_mass: torch.Tensor
    """1 - sum of the teacher's top-k probabilities."""
    student_topk_mass: torch.Tensor
    """The student's probability (full vocabulary, at the temperature) on the teacher's top-k."""
    top1_agreement: torch.Tensor
    """1.0 where the student's largest logit is at the teacher's top-1 id (ties count)."""


def resolve_implementation(
    implementation: str, device: torch.device, dtype: torch.dtype = torch.float32
) -> str:
    """The implementation to run: "auto" is "triton" on CUDA tensors of the kernel's dtypes
    (fp16, bf16, fp32), "torch" elsewhere."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}")
    if implementation == "auto":
        kernel_dtype = dtype in (torch.float16, torch.bfloat16, torch.float32)
        return "triton" if device.type == "cuda" and kernel_dtype else "torch"
    return implementation


def topk_kl(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    *,
    params: TopkKLParams | None = None,
    kl_type: KLType | None = None,
    mixed_kl_weight: float | None = None,
    jsd_beta: float | None = None,
    tail: Tail | None = None,
    temperature: float | None = None,
    vocab_start: int = 0,
    tp_group: dist.ProcessGroup | None = None,
    implementation: Implementation = "auto",
    inplace_grad: bool = False,
    validate: bool = False,
) -> torch.Tensor:
    """Per-position divergence between the student and the teacher's top-k, fp32.

    The divergence options come either as one `params` object or as the keywords kl_type,
    mixed_kl_weight, jsd_beta, tail and temperature (those left out take TopkKLParams'
    defaults: reverse KL, w = beta = 0.5, the tail bucket, temperature 1); giving both is an
    error.

    Args:
        student_logits: [..., V] logits (or the local vocab shard [..., V_local] under tensor
            parallelism), any float dtype; the math is fp32.
        teacher_logprobs: [..., k] the teacher's log-probs at its top-k ids, normalized over
            its full vocabulary (-inf for an id the teacher rules out).
        teacher_indices: [..., k] global vocab ids, distinct within a position; EMPTY_INDEX
            (-1, with a log-prob of -inf) marks a slot that holds nothing: no bucket, its
            student mass stays in the tail (a teacher mapped from another vocabulary).
        params: the divergence options as one object.
        kl_type: "forward" KL(P||Q), "reverse" KL(Q||P), "mixed" (w * forward + (1 - w) *
            reverse, w = mixed_kl_weight) or "jsd" (beta = jsd_beta).
        tail: "bucket" (the top-k plus one bucket for the rest of the vocabulary) or
            "renormalize" (both sides renormalized over the top-k).
        temperature: the student's log-probs are log_softmax(student_logits / temperature).
        vocab_start: global id of the first column of student_logits (tensor parallelism).
        tp_group: the tensor-parallel group whose ranks hold the vocab shards (None: the
            logits hold the whole vocabulary).
        implementation: "triton", "torch", or "auto" (triton on CUDA tensors, torch
            elsewhere). "triton" on CPU tensors runs the kernel in Triton's interpreter, which
            needs TRITON_INTERPRET=1 set before triton is first imported.
        inplace_grad: overwrite student_logits with the gradient during forward (saves one
            logits-sized buffer; the logits are destroyed, so nothing else may use them).
        validate: check the teacher's ids and log-probs (`validate_teacher_topk`); costs a
            host synchronization, a debugging aid.

    Returns:
        [...] divergence per position, fp32 (fp64 for fp64 logits with the torch
        implementation), differentiable with respect to student_logits.
    """
    keywords = dict(
        kl_type=kl_type,
        mixed_kl_weight=mixed_kl_weight,
        jsd_beta=jsd_beta,
        tail=tail,
        temperature=temperature,
    )
    given = {name: value for name, value in keywords.items() if value is not None}
    if params is not None and given:
        raise TypeError(
            f"topk_kl takes the divergence options either as params= or as keywords, not both "
            f"(got params and {sorted(given)})"
        )
    return topk_kl_with_stats(
        student_logits,
        teacher_logprobs,
        teacher_indices,
        params=TopkKLParams(**given) if params is None else params,
        vocab_start=vocab_start,
        tp_group=tp_group,
        implementation=implementation,
        inplace_grad=inplace_grad,
        validate=validate,
    )[0]


def topk_kl_with_stats(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    *,
    params: TopkKLParams = DEFAULT_PARAMS,
    **options: Any,
) -> tuple[torch.Tensor, TopkKLStats]:
    """`topk_kl` with the divergence options as `params`, plus per-position statistics.

    `options` are topk_kl's others: vocab_start, tp_group, implementation, inplace_grad,
    validate.

    Returns:
        (divergence [...], TopkKLStats of [...] tensors).
    """
    div, stats = _topk_kl(
        student_logits, teacher_logprobs, teacher_indices, None, params, **options
    )
    return div.reshape(student_logits.shape[:-1]), stats


def topk_kl_weighted_sum(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    weights: torch.Tensor,
    *,
    params: TopkKLParams = DEFAULT_PARAMS,
    **options: Any,
) -> tuple[torch.Tensor, TopkKLStats]:
    """sum(weights * topk_kl(...)) as a scalar, plus the per-position statistics.

    The weights ([...], e.g. loss_mask / global_valid_toks) are folded into the gradient
    during forward, so backward only multiplies it by the incoming scalar, and with the Triton
    kernel not even that when the scalar is 1 (decided on the device, without a host sync):
    one pass over the [N, V] gradient saved per step. Positions with weight 0 contribute
    nothing, even where their divergence is not finite. `params` and `options` as in
    `topk_kl_with_stats`.
    """
    if weights.shape != student_logits.shape[:-1]:
        raise ValueError(
            f"weights must have the positions' shape {tuple(student_logits.shape[:-1])}, "
            f"got {tuple(weights.shape)}"
        )
    return _topk_kl(student_logits, teacher_logprobs, teacher_indices, weights, params, **options)


def weighted_sum(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """sum(weights * values), a weight of 0 contributing 0 whatever its value (NaN, inf)."""
    weights = weights.to(values.dtype)
    return torch.where(weights != 0, values * weights, 0.0).sum()


class TopkKLFunction(torch.autograd.Function):
    """The autograd wrapper of both implementations: the gradient is computed in forward and
    only scaled in backward.

    forward(logits [N, V], teacher_logprobs [N, k], teacher_indices [N, k], row_weights [N] or
    None, run, scale_) returns (out, stats [N, 5]). `run(logits, teacher_logprobs,
    teacher_indices, need_grad=, row_weights=)` is an implementation's forward with its other
    options bound, returning (divergence [N], stats, gradient [N, V]). out is the divergence,
    or, with row_weights, the scalar sum(row_weights * divergence), whose gradient `run` folds
    into the stored one; backward then scales it by the incoming scalar with `scale_(grad,
    scalar)`, an in-place routine of the implementation (the Triton one skips the pass over
    the gradient when the scalar is 1).
    """

    @staticmethod
    def forward(ctx, logits, teacher_logprobs, teacher_indices, row_weights, run, scale_):
        div, stats, grad = run(
            logits, teacher_logprobs, teacher_indices, need_grad=True, row_weights=row_weights
        )
        ctx.mark_non_differentiable(stats)
        ctx.stored_grad = grad
        ctx.scale_ = scale_
        if row_weights is None:
            return div, stats
        return weighted_sum(div, row_weights), stats

    @staticmethod
    def backward(ctx, grad_out, grad_stats):
        grad = ctx.stored_grad
        if grad is None:
            raise RuntimeError(
                "topk_kl's gradient was already consumed: backward through it twice "
                "(retain_graph=True) is not supported"
            )
        ctx.stored_grad = None
        nones = (None,) * 5
        if grad_out is None:
            return None, *nones
        if grad_out.dim() == 0:
            return ctx.scale_(grad, grad_out), *nones
        return grad.mul_(grad_out.unsqueeze(-1)), *nones


def _implementation(name: str) -> tuple[Callable[..., Any], Callable[..., torch.Tensor]]:
    """(forward, in-place scaling by a 0-d tensor) of an implementation; triton is imported
    only when asked for."""
    if name == "triton":
        from nemo_opd.ops.topk_kl_triton import scale_grad_, topk_kl_triton_forward

        return topk_kl_triton_forward, scale_grad_
    from nemo_opd.losses.topk_kl_torch import topk_kl_torch_forward

    return topk_kl_torch_forward, torch.Tensor.mul_


def _fill_empty_rows(
    logprobs: torch.Tensor, indices: torch.Tensor, params: TopkKLParams
) -> tuple[torch.Tensor, torch.Tensor]:
    """Under tail="renormalize", a position whose slots are all empty (EMPTY_INDEX) has no
    distribution to renormalize: it gets one slot (id 0, log-prob 0), whose renormalized
    divergence is exactly 0 with no gradient. The tail bucket needs nothing: its empty S
    leaves one bucket holding everything on both sides, a divergence of 0."""
    if params.tail != "renormalize" or indices.numel() == 0:
        return logprobs, indices
    blank = (indices < 0).all(dim=-1, keepdim=True)
    first = torch.zeros_like(blank).expand_as(indices).clone()
    first[:, 0] = True
    fill = blank & first
    return logprobs.masked_fill(fill, 0.0), indices.masked_fill(fill, 0)


def _topk_kl(
    student_logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    weights: torch.Tensor | None,
    params: TopkKLParams,
    *,
    vocab_start: int = 0,
    tp_group: dist.ProcessGroup | None = None,
    implementation: Implementation = "auto",
    inplace_grad: bool = False,
    validate: bool = False,
) -> tuple[torch.Tensor, TopkKLStats]:
    """Checks, flattening and dispatch. Returns (the divergence [N], or the weighted sum when
    weights are given; the statistics shaped like the positions)."""
    if not isinstance(params, TopkKLParams):
        raise TypeError(f"params must be a TopkKLParams, got {type(params).__name__}")
    impl = resolve_implementation(implementation, student_logits.device, student_logits.dtype)
    check_topk_kl_inputs(
        student_logits,
        teacher_logprobs,
        teacher_indices,
        vocab_start=vocab_start,
        tp_group=tp_group,
    )
    lead, vocab, k = student_logits.shape[:-1], student_logits.shape[-1], teacher_indices.shape[-1]
    if validate:
        validate_teacher_topk(teacher_logprobs, teacher_indices, global_vocab_size(vocab, tp_group))
    logits = student_logits.reshape(-1, vocab)
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    if inplace_grad and logits.data_ptr() != student_logits.data_ptr():
        raise ValueError("inplace_grad needs student_logits contiguous along the vocab dim")
    logprobs, indices = _fill_empty_rows(
        teacher_logprobs.reshape(-1, k), teacher_indices.reshape(-1, k), params
    )
    row_weights = None if weights is None else weights.reshape(-1).to(torch.float32)

    forward, scale_ = _implementation(impl)
    run = functools.partial(
        forward,
        params=params,
        vocab_start=vocab_start,
        tp_group=tp_group,
        inplace_grad=inplace_grad,
    )
    if torch.is_grad_enabled() and student_logits.requires_grad:
        out, stats = TopkKLFunction.apply(logits, logprobs, indices, row_weights, run, scale_)
    else:
        out, stats, _ = run(logits, logprobs, indices, need_grad=False)
        if row_weights is not None:
            out = weighted_sum(out, row_weights)
    columns = (stats[:, i].reshape(lead) for i in range(stats.shape[1]))
    return out, TopkKLStats(*columns)
