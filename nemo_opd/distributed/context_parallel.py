"""Segment-aware causal attention with context parallelism by all-gathering keys and values.

Each context-parallel rank holds a contiguous shard of every row's positions. It computes the
queries, keys and values of its shard, all-gathers the keys and values of the whole row (as in
the Llama 3 paper), and attends its queries to them with the global causal offset. Packed rows
carry segment ids, and a query only sees keys of its own segment, so attention never crosses a
sequence boundary. Plain torch (scaled_dot_product_attention with a boolean mask): it runs on
CPU with gloo as well as on CUDA.

The function is registered with transformers' AttentionInterface under ATTENTION_NAME and
receives the layout of the current microbatch through the model's forward kwargs
(`nemo_opd_layout=AttentionLayout(...)`), which transformers passes down to attention.
"""

from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

ATTENTION_NAME = "nemo_opd_segment_attention"
LAYOUT_KWARG = "nemo_opd_layout"


@dataclass
class AttentionLayout:
    """Where this rank's query shard sits in the rows of the microbatch.

    Attributes:
        segment_ids: [b, S] segment id of every position of the FULL rows (all cp ranks hold
            it); positions attend only within their segment.
        q_start: index of this rank's first query position in the full row.
        cp_group: the context-parallel group (None or size 1: no gathering).
    """

    segment_ids: torch.Tensor
    q_start: int = 0
    cp_group: dist.ProcessGroup | None = None


class _GatherSequence(torch.autograd.Function):
    """All-gather along dim 2 ([b, h, s, d] -> [b, h, s * cp, d]); backward sums the
    gradients of every rank and keeps this rank's slice."""

    @staticmethod
    def forward(ctx, shard: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
        ctx.group = group
        ctx.rank = dist.get_rank(group)
        ctx.world = dist.get_world_size(group)
        parts = [torch.empty_like(shard) for _ in range(ctx.world)]
        dist.all_gather(parts, shard.contiguous(), group=group)
        return torch.cat(parts, dim=2)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(ctx.world, dim=2)[ctx.rank].contiguous(), None


def gather_sequence(shard: torch.Tensor, group: dist.ProcessGroup | None) -> torch.Tensor:
    """[b, h, s_local, d] -> [b, h, s_local * cp, d], differentiable."""
    if group is None or dist.get_world_size(group) == 1:
        return shard
    return _GatherSequence.apply(shard, group)


def segment_causal_mask(layout: AttentionLayout, q_len: int, k_len: int) -> torch.Tensor:
    """[b, 1, q_len, k_len] bool: key j visible to query i (causal, same segment)."""
    device = layout.segment_ids.device
    q_pos = torch.arange(q_len, device=device) + layout.q_start
    k_pos = torch.arange(k_len, device=device)
    causal = k_pos.unsqueeze(0) <= q_pos.unsqueeze(1)
    seg_q = layout.segment_ids[:, layout.q_start : layout.q_start + q_len]
    seg_k = layout.segment_ids[:, :k_len]
    same = seg_q.unsqueeze(-1) == seg_k.unsqueeze(-2)
    return (causal.unsqueeze(0) & same).unsqueeze(1)


def segment_causal_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """transformers attention function.

    Args:
        query: [b, h_q, s_local, d]; key, value: [b, h_kv, s_local, d] (local heads under
            tensor parallelism).
        attention_mask: ignored; the mask comes from kwargs[LAYOUT_KWARG] (an AttentionLayout;
            absent means one causal segment per row and no context parallelism).

    Returns:
        ([b, s_local, h_q, d] attention output, None).
    """
    layout = kwargs.get(LAYOUT_KWARG)
    if layout is None:
        segments = torch.zeros(
            query.shape[0], query.shape[2], dtype=torch.long, device=query.device
        )
        layout = AttentionLayout(segments)
    key = gather_sequence(key, layout.cp_group)
    value = gather_sequence(value, layout.cp_group)
    repeats = query.shape[1] // key.shape[1]
    if repeats > 1:
        key = key.repeat_interleave(repeats, dim=1)
        value = value.repeat_interleave(repeats, dim=1)
    mask = segment_causal_mask(layout, query.shape[2], key.shape[2])
    out = F.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=mask,
        dropout_p=dropout if module.training else 0.0,
        scale=scaling,
    )
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> str:
    """Register segment_causal_attention with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, segment_causal_attention)
    return ATTENTION_NAME
