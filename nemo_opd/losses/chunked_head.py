"""The LM head and the loss together, over chunks of positions: [N, V] logits never exist.

For a real vocabulary (151,936 ids for Qwen3) the logits of a microbatch dwarf everything else
it holds: 16k positions are 9.7 GiB in fp32, and their gradient as much again. Here the final
hidden states h [N, H] and the LM head's rows W [V_local, H] (and its bias b [V_local], where
the model's head has one) go in; for each chunk of C positions the chunk's logits, its loss
and the loss's gradient are computed at once, turned into the gradients of h_c, W and b, and
freed. The head is the model's own (nemo_opd/models/output_head.py), in two parts: the product
r_c = h_c W^T + b, whose gradients are formed here by hand, and the elementwise rest (the
family's scale or soft-cap, then the padding mask), z_c = finish(r_c), which autograd
differentiates:

    g = dL/dr_c        dL/dh_c = g W        dL/dW += g^T h_c        dL/db += sum_c g

so the peak is one chunk's logits and their gradient, [C, V_local] each. Backward only scales
the stored gradients by the incoming one (the loss is a scalar). Under tensor parallelism W is
this rank's vocabulary shard: the loss function's own collectives combine the shards of each
chunk, and dL/dh, partial on every rank, is summed over the tensor-parallel group once at the
end (what a column-parallel LM head's backward does).

The loss function is the training loss of the objective (DistillationLossFn,
PolicyGradientLossFn, NLLLossFn): per-position terms normalized by the global valid-token
count, so the chunks' losses add up to the microbatch's exactly. Its metrics are combined over
chunks like those of microbatches (sums, or *_min / *_max).

    loss, metrics = chunked_head_loss(hidden, weight, fields, loss_of_logits, chunk=1024,
                                      project=head.project, finish=transform_and_mask,
                                      bias=bias)

Under no_grad (evaluation: the validation divergence) chunked_head_loss only adds up the
chunks' losses: nothing is differentiated and no weight gradient is formed, though the LM
head's weight, a parameter, requires grad there too. chunked_scores does the same for scoring
(the teacher's top-k, log-probs).
"""

from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

from nemo_opd.losses.reduction import accumulate_metrics
from nemo_opd.models.output_head import PLAIN_HEAD

Project = Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]
"""project(hidden [C, H], weight [V_local, H], bias [V_local] or None) -> raw logits
[C, V_local]: the linear part of the model's head (OutputHead.project, in the engine's compute
precision)."""
Finish = Callable[[torch.Tensor], torch.Tensor]
"""finish(raw logits) -> logits: the elementwise rest of the head (OutputHead.transform) and
the padding columns masked; differentiable."""
ChunkLoss = Callable[[torch.Tensor, dict[str, torch.Tensor]], tuple[torch.Tensor, dict]]
"""loss_of_logits(logits [1, C, V_local], fields of the chunk [1, C, ...]) -> (loss, metrics)."""


def chunk_ranges(total: int, chunk: int) -> Iterator[tuple[int, int]]:
    """[start, end) of consecutive chunks of at most `chunk` positions covering range(total)."""
    for start in range(0, total, chunk):
        yield start, min(start + chunk, total)


def chunked_head_loss(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    fields: dict[str, torch.Tensor],
    loss_of_logits: ChunkLoss,
    *,
    chunk: int,
    project: Project = PLAIN_HEAD.project,
    finish: Finish = lambda raw: raw,
    bias: torch.Tensor | None = None,
    tp_group: dist.ProcessGroup | None = None,
    keep: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The loss of all positions of hidden, the LM head applied chunk by chunk.

    Args:
        hidden: [b, s, H] final hidden states (differentiable).
        weight: [V_local, H] this rank's LM-head rows (differentiable: its gradient reaches the
            parameter through whatever view it is).
        fields: the loss function's per-position inputs, [b, s, ...] each.
        loss_of_logits: the loss of one chunk (see ChunkLoss).
        chunk: positions per chunk.
        project, finish: the LM head, raw = project(h, W, bias), logits = finish(raw).
        bias: [V_local] this rank's entries of the LM head's bias (differentiable), or None.
        tp_group: the tensor-parallel group over which dL/dhidden is summed (None: no tp).
        keep: optional [b, s] bool, the positions whose loss terms can be nonzero (the loss
            mask's): the head runs on these only (at least one, so that every rank's metrics
            keep their names), and the others get a zero gradient. Exact for losses whose
            terms are masked by it: prompt, tool-output and padding positions cost nothing.

    Returns:
        (loss, a scalar whose backward reaches hidden, weight and bias; metrics, detached, combined
        over chunks). Under no_grad (evaluation) only the loss: no chunk is differentiated and
        no gradient is formed, although the weight, a parameter, still requires grad.
    """
    metrics: dict[str, torch.Tensor] = {}
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_fields = {name: value.reshape(-1, *value.shape[2:]) for name, value in fields.items()}
    if keep is not None:
        flat, flat_fields = _kept_positions(flat, flat_fields, keep)
    head = (project, finish)
    if not torch.is_grad_enabled():
        loss = _loss_without_grad(
            flat, weight, bias, head, loss_of_logits, flat_fields, chunk, metrics
        )
        return loss, metrics
    loss = _ChunkedHeadLoss.apply(
        flat, weight, bias, head, loss_of_logits, flat_fields, chunk, tp_group, metrics
    )
    return loss, metrics


def _kept_positions(
    flat: torch.Tensor, fields: dict[str, torch.Tensor], keep: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """hidden [N, H] and fields [N, ...] at the kept positions only (index_select: the
    gradient of hidden is scattered back, zero elsewhere); position 0 when none is kept."""
    index = keep.reshape(-1).nonzero().squeeze(1)
    if index.numel() == 0:
        index = torch.zeros(1, dtype=torch.long, device=flat.device)
    index = index.to(flat.device)
    return flat.index_select(0, index), {
        name: value.index_select(0, index.to(value.device)) for name, value in fields.items()
    }


def _loss_without_grad(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    head: tuple[Project, Finish],
    loss_of_logits: ChunkLoss,
    fields: dict[str, torch.Tensor],
    chunk: int,
    metrics: dict[str, torch.Tensor],
) -> torch.Tensor:
    """The summed loss of the chunks of hidden [N, H] (fields [N, ...]) with grad mode off, the
    chunks' metrics accumulated into `metrics`. autograd.Function.forward always runs with grad
    mode off, so _ChunkedHeadLoss cannot tell evaluation from training: this is evaluation."""
    project, finish = head
    total = torch.zeros((), dtype=torch.float32, device=hidden.device)
    for start, end in chunk_ranges(hidden.shape[0], chunk):
        part = {name: value[start:end].unsqueeze(0) for name, value in fields.items()}
        logits = finish(project(hidden[start:end], weight, bias)).unsqueeze(0)
        loss, chunk_metrics = loss_of_logits(logits, part)
        total += loss.float()
        accumulate_metrics(metrics, chunk_metrics)
    return total


class _ChunkedHeadLoss(torch.autograd.Function):
    """The loss and its gradients in one pass over the chunks (see the module docstring).

    Per chunk, autograd differentiates only the loss with respect to the raw logits; the LM
    head's gradients are formed from that by hand (dL/dh_c = g W, dL/dW += g^T h_c and
    dL/db += sum_c g, the last two accumulated in place in fp32), so besides one chunk the only
    weight-sized buffer is the weight's gradient itself."""

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        head: tuple[Project, Finish],
        loss_of_logits: ChunkLoss,
        fields: dict[str, torch.Tensor],
        chunk: int,
        tp_group: dist.ProcessGroup | None,
        metrics: dict[str, torch.Tensor],
    ) -> torch.Tensor:
        project, finish = head
        w = weight.detach()
        b = bias.detach() if bias is not None else None
        bias_grad = bias is not None and bias.requires_grad
        grad_bias = torch.zeros_like(b, dtype=torch.float32) if bias_grad else None
        grad_hidden = torch.empty_like(hidden) if hidden.requires_grad else None
        grad_weight = None  # fp32, allocated at the first chunk with a gradient
        total = torch.zeros((), dtype=torch.float32, device=hidden.device)
        for start, end in chunk_ranges(hidden.shape[0], chunk):
            h = hidden[start:end].detach()
            part = {name: value[start:end].unsqueeze(0) for name, value in fields.items()}
            with torch.enable_grad():
                raw = project(h, w, b).requires_grad_()
                loss, chunk_metrics = loss_of_logits(finish(raw).unsqueeze(0), part)
                differentiable = loss.requires_grad and (
                    grad_hidden is not None or weight.requires_grad or bias_grad
                )
                (g,) = torch.autograd.grad(loss, raw) if differentiable else (None,)
            total += loss.detach().float()
            accumulate_metrics(metrics, chunk_metrics)
            del raw, loss
            if g is None:
                if grad_hidden is not None:
                    grad_hidden[start:end] = 0
                continue
            if grad_hidden is not None:  # g in the weight's precision: no copy of W
                grad_hidden[start:end] = g.to(w.dtype) @ w
            if weight.requires_grad:
                g_t, h32 = g.t().float(), h.float()
                if grad_weight is None:
                    grad_weight = g_t @ h32
                else:
                    grad_weight.addmm_(g_t, h32)  # in place: no second weight-sized buffer
            if grad_bias is not None:
                grad_bias += g.float().sum(0)
            del g
        if grad_hidden is not None and tp_group is not None and dist.get_world_size(tp_group) > 1:
            dist.all_reduce(grad_hidden, group=tp_group)  # each vocab shard's share of dL/dh
        if weight.requires_grad and grad_weight is None:
            grad_weight = torch.zeros_like(w, dtype=torch.float32)
        ctx.save_for_backward(
            grad_hidden if grad_hidden is not None else torch.empty(0),
            grad_weight if grad_weight is not None else torch.empty(0),
            grad_bias if grad_bias is not None else torch.empty(0),
        )
        ctx.has_grads = (grad_hidden is not None, grad_weight is not None, grad_bias is not None)
        ctx.weight_dtype = weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return total

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        has_hidden, has_weight, has_bias = ctx.has_grads
        # The stored gradients are this call's own: scaled in place, handed over, not copied.
        if has_hidden:
            grad_hidden = grad_hidden.mul_(grad_loss.to(grad_hidden.dtype))
        if has_weight:
            grad_weight = grad_weight.mul_(grad_loss).to(ctx.weight_dtype)
        if has_bias:
            grad_bias = grad_bias.mul_(grad_loss).to(ctx.bias_dtype)
        return (
            grad_hidden if has_hidden else None,
            grad_weight if has_weight else None,
            grad_bias if has_bias else None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


@torch.no_grad()
def chunked_scores(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    score: Callable[[torch.Tensor, int, int], None],
    *,
    chunk: int,
    project: Project = PLAIN_HEAD.project,
    finish: Finish = lambda raw: raw,
    bias: torch.Tensor | None = None,
) -> None:
    """score(logits [C, V_local], start, end) for consecutive chunks of hidden's positions
    (flattened [b * s]), logits = finish(project(h, weight, bias)), without a gradient: the
    caller keeps what it needs of each chunk (the top-k, the log-probs) and the chunk's logits
    are freed."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    for start, end in chunk_ranges(flat.shape[0], chunk):
        score(finish(project(flat[start:end], weight, bias)), start, end)
