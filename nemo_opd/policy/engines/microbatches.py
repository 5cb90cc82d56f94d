"""Microbatches: a data-parallel rank's rows split into forward passes, and their per-position
outputs written back to the rows they came from.

Three ways to split, by the model section (policy or teacher): sequence packing (several rows
in one, first-fit-decreasing up to a token budget: nemo_opd.data.packing), dynamic batching
(rows grouped up to a token budget) or a fixed number of rows. Row lengths are padded to a
multiple the engine gives (context parallel needs cp | S). The engine base (base.py) runs the
microbatches and keeps every dp rank's count equal (its collectives).

    microbatches = split_rows(data, ("targets",), cfg, token_budget(cfg, train=False),
                              cfg.logprob_batch_size, multiple)
    scatter(values_of(mb), mb, out)     # [b, s, ...] -> the rows of out [B, S, ...]
"""

from dataclasses import dataclass

import torch

from nemo_opd.config import PolicyConfig
from nemo_opd.data.batching import (
    TensorBatch,
    dynamic_microbatches,
    fixed_microbatches,
    round_up,
)
from nemo_opd.data.packing import PackedRow, pack_row, plan_packing, unpack_row


@dataclass
class Microbatch:
    """Full rows of one forward pass (before context-parallel splitting).

    Attributes:
        input_ids, position_ids, segment_ids: [b, s].
        fields: other per-position tensors [b, s, ...] (loss_mask, teacher top-k, targets).
        rows: original row of each of the b rows (unpacked), or None when packed.
        packed: the PackedRow when this microbatch is one packed row (b = 1).
        dummy: a stand-in that only keeps collectives in step (its fields are zero and its
            outputs are dropped).
        contexts: shared-prefix scoring's attention contexts (AttentionLayout.contexts), or
            None.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    fields: dict[str, torch.Tensor]
    rows: list[int] | None = None
    packed: PackedRow | None = None
    dummy: bool = False
    contexts: list[dict[int, tuple[int, int]]] | None = None


def token_budget(cfg: PolicyConfig, train: bool) -> int | None:
    """Tokens per microbatch with sequence packing or dynamic batching (the training or the
    scoring budget); None with a fixed number of rows."""
    packing, dynamic = cfg.sequence_packing, cfg.dynamic_batching
    if packing.enabled:
        return packing.train_mb_tokens if train else packing.logprob_mb_tokens
    if dynamic.enabled:
        return dynamic.train_mb_tokens if train else dynamic.logprob_mb_tokens
    return None


def split_rows(
    data: TensorBatch,
    field_names: tuple[str, ...],
    cfg: PolicyConfig,
    budget: int | None,
    rows_per_microbatch: int,
    multiple: int,
) -> list[Microbatch]:
    """This rank's rows in microbatches (packed, dynamic or fixed-size), each carrying the
    fields named; row lengths padded to a multiple of `multiple`."""
    lengths = data["input_lengths"].tolist()
    fields = {key: data[key] for key in field_names}
    if cfg.sequence_packing.enabled:
        return _packed(data["input_ids"], fields, lengths, budget, cfg, multiple)
    if cfg.dynamic_batching.enabled:
        round_to = cfg.dynamic_batching.sequence_length_round
        groups = dynamic_microbatches(lengths, budget, round_to)
    else:
        groups = fixed_microbatches(len(lengths), rows_per_microbatch)
    return [
        padded_microbatch(data["input_ids"], fields, lengths, rows, multiple) for rows in groups
    ]


def dummy_like(template: Microbatch) -> Microbatch:
    """A stand-in of the template's shape with zero fields (Microbatch.dummy)."""
    return Microbatch(
        input_ids=template.input_ids,
        position_ids=template.position_ids,
        segment_ids=template.segment_ids,
        fields={k: torch.zeros_like(v) for k, v in template.fields.items()},
        dummy=True,
        contexts=template.contexts,
    )


def scatter(values: torch.Tensor, mb: Microbatch, out: torch.Tensor) -> None:
    """Write a microbatch's per-position values [b, s, ...] to their rows of out."""
    if mb.dummy:
        return
    if mb.packed is not None:
        unpack_row(values, mb.packed, out)
        return
    width = min(values.shape[1], out.shape[1])
    index = torch.tensor(mb.rows, device=out.device)
    out[index, :width] = values[:, :width].to(out.dtype)


def padded_microbatch(input_ids, fields, lengths, rows, multiple) -> Microbatch:
    """Rows `rows` of input_ids and fields [B, S, ...], truncated to their longest length
    (lengths) rounded up to the multiple."""
    width = round_up(max(max(lengths[r] for r in rows), 1), multiple)
    index = torch.tensor(rows, device=input_ids.device)

    def take(tensor: torch.Tensor) -> torch.Tensor:
        picked = tensor.index_select(0, index)[:, :width]
        missing = width - picked.shape[1]
        if missing > 0:
            pad = picked.new_zeros((picked.shape[0], missing, *picked.shape[2:]))
            picked = torch.cat([picked, pad], dim=1)
        return picked

    ids = take(input_ids)
    positions = torch.arange(width, device=ids.device).expand_as(ids)
    return Microbatch(
        input_ids=ids,
        position_ids=positions,
        segment_ids=torch.zeros_like(ids),
        fields={key: take(value) for key, value in fields.items()},
        rows=rows,
    )


def _packed(input_ids, fields, lengths, capacity, cfg, multiple) -> list[Microbatch]:
    """One packed row per microbatch (first-fit-decreasing over this rank's rows)."""
    packing = cfg.sequence_packing
    bins = plan_packing(lengths, capacity, packing.sequence_length_round, packing.algorithm)
    microbatches = []
    for sequences in bins:
        row = pack_row(
            {"input_ids": input_ids, **fields},
            lengths,
            sequences,
            capacity=capacity,
            round_to=packing.sequence_length_round,
            pad_to=multiple,
        )
        tensors = dict(row.tensors)
        microbatches.append(
            Microbatch(
                input_ids=tensors.pop("input_ids"),
                position_ids=row.position_ids,
                segment_ids=row.segment_ids,
                fields=tensors,
                packed=row,
            )
        )
    return microbatches
