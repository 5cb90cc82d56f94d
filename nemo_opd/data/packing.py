"""Sequence packing: several sequences share one row, separated by cu_seqlens boundaries.

A packed row lays its sequences end to end, each in a slot of its length rounded up to
`round_to` (slot padding belongs to the sequence, after its real tokens), and the row is
right-padded to a multiple of `pad_to` (for context parallelism). Within a row:

    position_ids  restart at 0 in every slot,
    segment_ids   number the slots (the row's tail padding is one more segment),
    cu_seqlens    [num_slots + 1] slot boundaries (the tail padding excluded).

Attention must never cross a segment boundary (the engines mask by segment id), and the loss
mask must be aligned on the unpacked rows before packing so that no position predicts a token
of the next sequence.
"""

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from nemo_opd.data.batching import round_up

ALGORITHMS = (
    "concatenative",
    "first_fit_decreasing",
    "first_fit_shuffle",
    "modified_first_fit_decreasing",
)


def plan_packing(
    lengths: Sequence[int],
    capacity: int,
    round_to: int = 1,
    algorithm: str = "first_fit_decreasing",
) -> list[list[int]]:
    """Assign sequences to rows of at most `capacity` tokens.

    Args:
        lengths: real tokens per sequence.
        capacity: the most tokens (slot lengths summed) a row may hold.
        round_to: each sequence's slot is its length rounded up to this (capped at capacity).
        algorithm: "first_fit_decreasing" (longest first, first row it fits in),
            "modified_first_fit_decreasing" (the same here), "first_fit_shuffle" (first fit in
            a seeded random order) or "concatenative" (in order, a new row when full).

    Returns:
        bins: sequence indices per row; every sequence appears exactly once.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"packing algorithm must be one of {ALGORITHMS}, got {algorithm!r}")
    too_long = [n for n in lengths if n > capacity]
    if too_long:
        raise ValueError(f"sequence of {max(too_long)} tokens does not fit a {capacity}-token row")
    slots = [slot_length(n, capacity, round_to) for n in lengths]
    order = list(range(len(lengths)))
    if algorithm in ("first_fit_decreasing", "modified_first_fit_decreasing"):
        order.sort(key=lambda i: -slots[i])
    elif algorithm == "first_fit_shuffle":
        random.Random(0).shuffle(order)
    bins: list[list[int]] = []
    used: list[int] = []
    for seq in order:
        candidates = range(len(bins)) if algorithm != "concatenative" else range(len(bins))[-1:]
        target = next((b for b in candidates if used[b] + slots[seq] <= capacity), None)
        if target is None:
            bins.append([])
            used.append(0)
            target = len(bins) - 1
        bins[target].append(seq)
        used[target] += slots[seq]
    return bins


def slot_length(length: int, capacity: int, round_to: int) -> int:
    """A sequence's slot: its length rounded up to `round_to`, at most `capacity`, at least 1."""
    return max(1, min(round_up(length, round_to), capacity))


@dataclass
class PackedRow:
    """One packed row and where each of its sequences came from.

    Attributes:
        tensors: every packed field, [1, T, ...].
        position_ids: [1, T] int64, restarting per slot.
        segment_ids: [1, T] int64, the slot index (tail padding: len(sequences)).
        cu_seqlens: [len(sequences) + 1] int32 slot boundaries.
        sequences: the original row index of each slot.
        lengths: real tokens of each slot's sequence.
    """

    tensors: dict[str, torch.Tensor]
    position_ids: torch.Tensor
    segment_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    sequences: list[int]
    lengths: list[int]


def pack_row(
    fields: Mapping[str, torch.Tensor],
    lengths: Sequence[int],
    sequences: Sequence[int],
    *,
    capacity: int,
    round_to: int = 1,
    pad_to: int = 1,
) -> PackedRow:
    """Pack rows `sequences` of every [B, S, ...] field into one [1, T, ...] row.

    Each sequence contributes its first lengths[i] positions; slot and tail padding are 0.
    T is the summed slot lengths rounded up to `pad_to`.
    """
    slots = [slot_length(lengths[i], capacity, round_to) for i in sequences]
    total = round_up(sum(slots), pad_to)
    ref = next(iter(fields.values()))
    device = ref.device
    position_ids = torch.zeros(total, dtype=torch.long, device=device)
    segment_ids = torch.full((total,), len(slots), dtype=torch.long, device=device)
    packed = {key: value.new_zeros((total, *value.shape[2:])) for key, value in fields.items()}
    offset = 0
    for slot_index, (seq, slot) in enumerate(zip(sequences, slots, strict=True)):
        take = min(lengths[seq], slot)
        for key, value in fields.items():
            packed[key][offset : offset + take] = value[seq, :take]
        position_ids[offset : offset + slot] = torch.arange(slot, device=device)
        segment_ids[offset : offset + slot] = slot_index
        offset += slot
    cu = torch.tensor([0, *torch.tensor(slots).cumsum(0).tolist()], dtype=torch.int32)
    return PackedRow(
        tensors={key: value.unsqueeze(0) for key, value in packed.items()},
        position_ids=position_ids.unsqueeze(0),
        segment_ids=segment_ids.unsqueeze(0),
        cu_seqlens=cu,
        sequences=list(sequences),
        lengths=[lengths[i] for i in sequences],
    )


def unpack_row(values: torch.Tensor, row: PackedRow, out: torch.Tensor) -> None:
    """Write a packed row's per-position values [1, T, ...] back into out [B, S, ...].

    Each sequence's first `length` positions are written to its original row; the rest of
    `out` is left untouched.
    """
    starts = row.cu_seqlens[:-1].tolist()
    for seq, start, length in zip(row.sequences, starts, row.lengths, strict=True):
        out[seq, :length] = values[0, start : start + length]
