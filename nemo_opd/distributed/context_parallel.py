"""Segment-aware causal attention with context parallelism by all-gathering keys and values.

Each context-parallel rank holds a contiguous shard of every row's positions. It computes the
queries, keys and values of its shard, all-gathers the keys and values of the whole row (as in
the Llama 3 paper), and attends its queries to them with the global causal offset. Packed rows
carry segment ids, and a query only sees keys of its own segment, so attention never crosses a
sequence boundary. Plain torch scaled_dot_product_attention: it runs on CPU with gloo as well as
on CUDA.

Which attention runs:
- context parallel: one boolean [b, 1, s_local, s] mask (causal from the shard's offset, same
  segment), over the gathered keys;
- no context parallel, one segment per row (padded microbatches): plain causal attention
  (is_causal, so the fused kernels apply);
- no context parallel, packed rows: causal attention per segment (a segment is a contiguous run
  of equal ids, as packing writes them), so the cost is the sum of the squared sequence lengths,
  not the square of the packed row's. Per segment, one scaled_dot_product_attention call each
  (`per_segment`, any device), or every segment of the microbatch in one call of torch's
  variable-length flash attention (`varlen`: CUDA, bf16 or fp16, no dropout), as the layout's
  packed_attention says (policy.dtensor_cfg.packed_attention; `auto` is varlen where it runs).

The function is registered with transformers' AttentionInterface under ATTENTION_NAME and
receives the layout of the current microbatch through the model's forward kwargs
(`nemo_opd_layout=AttentionLayout(...)`), which transformers passes down to attention.
"""

import functools
import inspect
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
    runs: list[list[tuple[int, int]]] | None = None
    """Per row, the (start, end) of each run of equal segment ids (segment_runs), precomputed
    by the DTensor engine when there is no context parallelism; None computes it where needed.
    (A plain list: FSDP rebuilds tensor-holding kwargs before every layer, and copies it.)"""
    packed_attention: str = "per_segment"
    """How packed rows attend without context parallelism: "per_segment", "varlen" or "auto"
    (module docstring; policy.dtensor_cfg.packed_attention)."""
    contexts: list[dict[int, tuple[int, int]]] | None = None
    """Shared-prefix scoring (policy/engines/shared_prefix.py), without context parallelism:
    per row, {start of a run: (start, end) of the run it also attends to, all of it} (a
    suffix's shared prefix, earlier in the row); runs not named attend only to themselves."""


def segment_runs(segment_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """[b, S] segment ids -> per row, the (start, end) of each run of equal ids."""
    change = torch.ones_like(segment_ids, dtype=torch.bool)
    change[:, 1:] = segment_ids[:, 1:] != segment_ids[:, :-1]
    width = segment_ids.shape[1]
    starts = [row.nonzero().flatten().tolist() for row in change.cpu()]
    return [list(zip(row, [*row[1:], width], strict=True)) for row in starts]


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
    dropout_p = dropout if module.training else 0.0
    runs = None
    if layout.cp_group is None:
        runs = layout.runs if layout.runs is not None else segment_runs(layout.segment_ids)
        packed = any(len(row) > 1 for row in runs)
        plain = layout.contexts is None
        if packed and plain and use_varlen(layout.packed_attention, query, dropout_p):
            return causal_varlen(query, key, value, runs, scaling), None
    key = gather_sequence(key, layout.cp_group)
    value = gather_sequence(value, layout.cp_group)
    repeats = query.shape[1] // key.shape[1]
    if repeats > 1:
        key = key.repeat_interleave(repeats, dim=1)
        value = value.repeat_interleave(repeats, dim=1)
    if runs is None:  # context parallel: the shard attends to the whole row
        mask = segment_causal_mask(layout, query.shape[2], key.shape[2])
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=mask, dropout_p=dropout_p, scale=scaling
        )
    else:
        contexts = layout.contexts or [{} for _ in runs]
        out = _causal_per_segment(query, key, value, runs, dropout_p, scaling, contexts)
    return out.transpose(1, 2).contiguous(), None


def _causal_per_segment(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    runs: list[list[tuple[int, int]]],
    dropout_p: float,
    scaling: float | None,
    contexts: list[dict[int, tuple[int, int]]],
) -> torch.Tensor:
    """[b, h, s, d] causal attention within each run of every row (see segment_runs); a run
    with a context (AttentionLayout.contexts) also sees every key of that context."""
    if all(len(row) == 1 for row in runs) and not any(contexts):
        return F.scaled_dot_product_attention(
            query, key, value, is_causal=True, dropout_p=dropout_p, scale=scaling
        )
    rows = []
    for index, (row, row_contexts) in enumerate(zip(runs, contexts, strict=True)):
        pieces = []
        for start, end in row:
            q, k, v = (t[index : index + 1, :, start:end] for t in (query, key, value))
            context = row_contexts.get(start)
            if context is None:
                out = F.scaled_dot_product_attention(
                    q, k, v, is_causal=True, dropout_p=dropout_p, scale=scaling
                )
            else:
                first, last = context
                before = (t[index : index + 1, :, first:last] for t in (key, value))
                out = _causal_after_context(q, k, v, *before, dropout_p, scaling)
            pieces.append(out)
        rows.append(torch.cat(pieces, dim=2))
    return torch.cat(rows, dim=0)


def varlen_available(device: torch.device) -> bool:
    """Whether torch's variable-length flash attention can run on `device`: CUDA, and a torch
    whose torch.nn.attention.varlen.varlen_attn takes a window (for causality) and a scale
    (the releases since 2.10; the first one took is_causal instead)."""
    return device.type == "cuda" and {"window_size", "scale"} <= _varlen_parameters()


@functools.cache
def _varlen_parameters() -> frozenset[str]:
    """The keyword arguments torch's varlen_attn takes (none without torch.nn.attention.varlen)."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return frozenset()
    return frozenset(inspect.signature(varlen_attn).parameters)


def varlen_runs(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether torch's varlen flash attention runs for attention computing in `dtype` on
    `device`: varlen_available there, and bf16 or fp16."""
    return dtype in (torch.bfloat16, torch.float16) and varlen_available(device)


def use_varlen(choice: str, query: torch.Tensor, dropout_p: float) -> bool:
    """Whether packed rows attend through causal_varlen: asked for ("varlen"), or "auto" where
    it runs (varlen_runs, and no dropout)."""
    if choice == "per_segment":
        return False
    runs = dropout_p == 0.0 and varlen_runs(query.device, query.dtype)
    if choice == "varlen" and not runs:
        raise RuntimeError(
            "packed_attention varlen needs CUDA, bf16 or fp16 and no attention dropout; this "
            f"attention computes in {query.dtype} on {query.device.type} with dropout "
            f"{dropout_p}: set policy.dtensor_cfg.packed_attention to auto or per_segment"
        )
    return runs


def causal_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    runs: list[list[tuple[int, int]]],
    scaling: float | None,
    attend=None,
) -> torch.Tensor:
    """Causal attention within each run of every row, all in one call of torch's varlen flash
    attention: the rows laid end to end, one sequence per run.

    Args:
        query: [b, h_q, s, d]; key, value: [b, h_kv, s, d] (h_q a multiple of h_kv).
        runs: per row, the (start, end) of each run, covering the row (segment_runs).
        attend: the varlen function (torch.nn.attention.varlen.varlen_attn's arguments and
            result, enable_gqa included); default torch's, with the key and value heads
            repeated where it has no enable_gqa.

    Returns:
        [b, s, h_q, d], the layout transformers expects from an attention function.
    """
    grouped = {"enable_gqa": True}  # key and value heads shared by groups of query heads
    if attend is None:
        from torch.nn.attention.varlen import varlen_attn as attend

        if "enable_gqa" not in _varlen_parameters():  # a release before grouped heads
            grouped = {}
    b, h, s, d = query.shape
    if key.shape[1] != h and not grouped:
        key = key.repeat_interleave(h // key.shape[1], dim=1)
        value = value.repeat_interleave(h // value.shape[1], dim=1)
    starts = [row * s + start for row, spans in enumerate(runs) for start, _ in spans]
    bounds = torch.tensor([*starts, b * s], dtype=torch.int32, device=query.device)
    longest = max(end - start for spans in runs for start, end in spans)

    def tokens(t: torch.Tensor) -> torch.Tensor:  # [b, heads, s, d] -> [b * s, heads, d]
        return t.transpose(1, 2).reshape(b * s, t.shape[1], d)

    out = attend(
        tokens(query),
        tokens(key),
        tokens(value),
        bounds,
        bounds,
        longest,
        longest,
        scale=scaling,
        window_size=(-1, 0),  # causal
        **(grouped if key.shape[1] != h else {}),
    )
    return out.view(b, s, h, d)


def _causal_after_context(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    context_key: torch.Tensor,
    context_value: torch.Tensor,
    dropout_p: float,
    scaling: float | None,
) -> torch.Tensor:
    """[1, h, n, d] attention of a run's n queries to every one of a context's m keys and
    causally to the run's own: query i sees context keys 0..m-1 and run keys 0..i, as the run
    would if it followed the context in one row."""
    m, n = context_key.shape[2], query.shape[2]
    visible = torch.ones(n, m + n, dtype=torch.bool, device=query.device).tril(diagonal=m)
    return F.scaled_dot_product_attention(
        query,
        torch.cat([context_key, key], dim=2),
        torch.cat([context_value, value], dim=2),
        attn_mask=visible,
        dropout_p=dropout_p,
        scale=scaling,
    )


def register_attention() -> str:
    """Register segment_causal_attention with transformers (idempotent); returns its name."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, segment_causal_attention)
    return ATTENTION_NAME
