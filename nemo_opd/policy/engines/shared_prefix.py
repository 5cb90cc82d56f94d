"""Shared-prefix scoring: rows that start with the same tokens (the samples of one prompt) are
scored with those tokens run once (dtensor_cfg.shared_prefix_scoring).

A scoring microbatch is one row that holds groups end to end. A group is a prefix P, the L
tokens all its rows start with, followed by each row's tokens after P (its suffix); a suffix
attends to every token of P and causally to itself (the attention reads the layout's
contexts: nemo_opd.distributed.context_parallel), and keeps the positions it has in its row:

    [ P | S_1 | S_2 | ... | S_n ][ P' | S'_1 | ... ][ a row alone ] ... [padding]
    positions    P: 0 .. L-1    S_i: L .. len_i - 1

Each row's hidden states are then its prefix's followed by its suffix's (ScoringRow.expand):
those of the row run whole, to the float rounding of the attention's order. A group keeps at
least one token of every row in its suffix, and rows that share fewer than MIN_SHARED tokens
with every other row are groups of their own, with no prefix. Groups fill rows of at most
`budget` tokens (first fit, longest first); a group too long for one is split, its prefix
repeated in each part.

    rows = plan_scoring_rows(input_ids, lengths, budget, multiple)
    states = row.expand(hidden)   # [1, T, H] of the Microbatch row.forward -> [n, width, H]
    items = shared_prefix_microbatches(data, fields, cfg, multiple, busiest_count)
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from nemo_opd.config import PolicyConfig
from nemo_opd.data.batching import TensorBatch, round_up
from nemo_opd.data.packing import plan_packing
from nemo_opd.policy.engines.microbatches import (
    Microbatch,
    dummy_like,
    padded_microbatch,
    token_budget,
)

MIN_SHARED = 16
"""The fewest tokens rows must share at their start to be scored as a group."""


@dataclass
class Group:
    """Rows (their indices in the batch) scored after one shared prefix of `shared` tokens."""

    rows: list[int]
    shared: int

    def tokens(self, lengths: list[int]) -> int:
        """Tokens the group takes in a scoring row: its prefix once and every suffix."""
        return self.shared + sum(lengths[r] - self.shared for r in self.rows)


@dataclass
class ScoringRow:
    """One scoring microbatch of shared-prefix groups.

    Attributes:
        rows: the batch rows whose scores it gives, in order.
        forward: what runs forward: input_ids, position_ids and segment_ids [1, T], the groups
            laid end to end, and the one row's attention contexts (no fields).
        index: [len(rows), width] where each of those rows' positions sits in the scoring
            row (T for positions past a row's length: a zero row expand appends).
    """

    rows: list[int]
    forward: Microbatch
    index: torch.Tensor

    def expand(self, hidden: torch.Tensor) -> torch.Tensor:
        """[1, T, ...] per-position values of the scoring row -> [len(rows), width, ...], each
        row's as if it had been run alone (zero past its length)."""
        padded = torch.cat([hidden[0], hidden.new_zeros(1, *hidden.shape[2:])])
        return padded[self.index.to(hidden.device)]


def plan_scoring_rows(
    input_ids: torch.Tensor, lengths: list[int], budget: int, multiple: int = 1
) -> list[ScoringRow]:
    """The batch's rows [B, S] (real lengths `lengths`) as shared-prefix scoring rows of at
    most `budget` tokens each, padded to a multiple of `multiple`; every row in exactly one.
    Each scoring row's `index` is as wide as its longest row, rounded up to `multiple`."""
    found = find_groups(input_ids.cpu(), lengths)  # compared on the host: no sync per row
    groups = [part for group in found for part in _fit(group, lengths, budget)]
    sizes = [group.tokens(lengths) for group in groups]
    bins = plan_packing(sizes, budget, 1, "first_fit_decreasing")
    return [
        _scoring_row([groups[g] for g in sorted(b)], input_ids, lengths, multiple) for b in bins
    ]


def find_groups(input_ids: torch.Tensor, lengths: list[int]) -> list[Group]:
    """Rows grouped by the tokens they start with (input_ids on the host): rows whose first
    MIN_SHARED tokens are the same share their longest common start, less one token (every row
    keeps a suffix); the others are groups of one row with no prefix. In the order of each
    group's first row."""
    by_start: dict[bytes, list[int]] = {}
    alone: list[int] = []
    for row, length in enumerate(lengths):
        if length > MIN_SHARED:
            by_start.setdefault(input_ids[row, :MIN_SHARED].numpy().tobytes(), []).append(row)
        else:
            alone.append(row)
    groups = [Group([row], 0) for row in alone]
    for rows in by_start.values():
        if len(rows) == 1:
            groups.append(Group(rows, 0))
            continue
        shortest = min(lengths[r] for r in rows)
        heads = input_ids[rows, :shortest]
        same = (heads == heads[0]).all(dim=0)
        common = int(same.long().cumprod(0).sum())
        groups.append(Group(rows, min(common, shortest - 1)))
    return sorted(groups, key=lambda group: group.rows[0])


def _fit(group: Group, lengths: list[int], budget: int) -> list[Group]:
    """The group, split into parts of at most `budget` tokens (each repeating the prefix)."""
    parts: list[Group] = []
    for row in group.rows:
        suffix = lengths[row] - group.shared
        if parts and parts[-1].tokens(lengths) + suffix <= budget:
            parts[-1].rows.append(row)
        else:
            parts.append(Group([row], group.shared))
    return [part if len(part.rows) > 1 else Group(part.rows, 0) for part in parts]


def _scoring_row(
    groups: list[Group], input_ids: torch.Tensor, lengths: list[int], multiple: int
) -> ScoringRow:
    """The groups laid end to end in one row (module docstring)."""
    ids, positions, segments, index_rows = [], [], [], []
    contexts: dict[int, tuple[int, int]] = {}
    at = 0

    def lay(row: int, first: int, last: int) -> int:
        """Positions first..last-1 of `row` at `at`, as one segment; returns where they start."""
        nonlocal at
        start = at
        ids.append(input_ids[row, first:last])
        positions.append(torch.arange(first, last))
        segments.append(torch.full((last - first,), len(segments)))
        at += last - first
        return start

    rows = [row for group in groups for row in group.rows]
    width = round_up(max(lengths[row] for row in rows), multiple)
    for group in groups:
        prefix = lay(group.rows[0], 0, group.shared) if group.shared else None
        for row in group.rows:
            start = lay(row, group.shared, lengths[row])
            if prefix is not None:
                contexts[start] = (prefix, prefix + group.shared)
            where = torch.arange(lengths[row]) - group.shared + start
            if prefix is not None:
                where[: group.shared] = torch.arange(prefix, prefix + group.shared)
            index_rows.append(where)
    total = round_up(at, multiple)
    tail = total - at
    input_row = torch.cat([*ids, input_ids.new_zeros(tail)]).unsqueeze(0)
    position_row = torch.cat([*positions, torch.zeros(tail, dtype=torch.long)]).unsqueeze(0)
    segment_row = torch.cat([*segments, torch.full((tail,), len(segments))]).unsqueeze(0)
    index = torch.full((len(rows), width), total, dtype=torch.long)
    for slot, where in enumerate(index_rows):
        index[slot, : len(where)] = where
    forward = Microbatch(
        input_ids=input_row,
        position_ids=position_row.to(input_ids.device),
        segment_ids=segment_row.to(input_ids.device),
        fields={},
        contexts=[contexts],
    )
    return ScoringRow(rows=rows, forward=forward, index=index)


def shared_prefix_microbatches(
    data: TensorBatch,
    fields: tuple[str, ...],
    cfg: PolicyConfig,
    multiple: int,
    busiest_count: Callable[[int], int],
) -> list[tuple[Microbatch, Microbatch, ScoringRow]]:
    """A rank's scoring microbatches under shared-prefix scoring, as many as the busiest dp
    rank's (busiest_count: the most any rank runs, a collective): (what runs forward, the rows
    it scores as a padded microbatch carrying `fields`, the ScoringRow that maps one to the
    other). The token budget is scoring's (or logprob_batch_size full rows), at least the
    longest row; rows are padded to a multiple of `multiple`."""
    lengths = data["input_lengths"].tolist()
    budget = token_budget(cfg, train=False)
    budget = budget or cfg.logprob_batch_size * data["input_ids"].shape[1]
    budget = max(budget, max(lengths, default=1))
    values = {key: data[key] for key in fields}
    items = []
    for row in plan_scoring_rows(data["input_ids"], lengths, budget, multiple):
        output = padded_microbatch(data["input_ids"], values, lengths, row.rows, multiple)
        items.append((row.forward, output, row))
    template, busiest = items[0], busiest_count(len(items))
    while len(items) < busiest:  # one collective, then the same count everywhere
        items.append((dummy_like(template[0]), dummy_like(template[1]), template[2]))
    return items
