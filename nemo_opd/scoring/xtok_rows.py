"""The teacher's rows of a batch and where its answers go in the student's positions.

A teacher with another tokenizer scores the student's conversations rendered in its own tokens
(nemo_opd.scoring.rendering.TeacherRendering). `TeacherRows` holds those rows and, for
every assistant turn, how its tokens align with the student's (`TurnPair`); its methods move
the teacher's answers back: the top-k onto the student's positions and vocabulary
(`topk_to_student`), sampled log-probs as each student token's share of its aligned group
(`logprobs_to_student`), and the per-row counts behind the cross-tokenizer metrics
(`counts`, named by COUNTS).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from nemo_opd.data.message_log import Message
from nemo_opd.losses.checks import EMPTY_INDEX
from nemo_opd.scoring.xtok_align import spread_over_groups
from nemo_opd.scoring.xtok_vocab import VocabMap

COUNTS = ("unrendered", "truncated", "predicting", "graded", "chained", "mapped_mass", "mapped")
"""The columns of TeacherRows.counts, per row: the row was not rendered; it was cut at the
teacher's longest row; its positions that predict one of its assistant tokens; those graded
(a teacher distribution or a chained slot); those graded by a chained slot; and over its
positions graded by a whole distribution (`mapped` of them), the sum of the share of the
teacher's top-k mass that maps to student ids. The top-k columns are 0 without a top-k."""


@dataclass
class TurnPair:
    """One assistant turn on both sides: where its tokens sit in each row and how they align."""

    student_start: int
    """Row position of the turn's first student token."""
    teacher_start: int
    """Row position of the turn's first teacher token."""
    source: np.ndarray
    """[n_s] int64: per student content token, the teacher content token starting at its byte
    (-1: none)."""
    spans_several: np.ndarray
    """[n_s] int64: per graded student token, how many teacher tokens its bytes cover (1 for a
    token that ends at or before the end of the one it starts with)."""
    student_group: np.ndarray
    """[n_s] int64: aligned group of each student content token."""
    teacher_group: np.ndarray
    """[n_t] int64: aligned group of each teacher content token."""
    student_ids: np.ndarray
    """[n_s] int64: the student's content ids."""
    end_of_turn: bool
    """Both sides close the turn: the student's end-of-turn token and the teacher's."""

    kept: int = -1
    """Teacher content tokens inside the row (-1: all); see cut_at."""

    @property
    def num_student(self) -> int:
        return len(self.source)

    @property
    def num_teacher(self) -> int:
        return len(self.teacher_group)

    def cut_at(self, length: int) -> None:
        """Keep only what a teacher row cut to `length` tokens can say: student tokens whose
        teacher tokens all lie inside it, the end of turn if its token does, and sampled
        log-probs only for the groups wholly inside (the rest of the turn is not graded)."""
        kept = int(np.clip(length - self.teacher_start, 0, self.num_teacher))
        inside = (self.source >= 0) & (self.source + np.maximum(self.spans_several, 1) <= kept)
        self.source = np.where(inside, self.source, -1)
        self.end_of_turn = self.end_of_turn and self.teacher_start + self.num_teacher < length
        self.kept = kept

    def chains(self, width: int) -> np.ndarray:
        """[n, 4] int64: the turn's student positions (inside `width`) whose next token spans
        several teacher tokens, as (student position, first teacher position, teacher token
        count, the student's sampled id)."""
        several = np.flatnonzero((self.source >= 0) & (self.spans_several > 1))
        positions = self.student_start + several - 1
        inside = (positions >= 0) & (positions < width)
        several, positions = several[inside], positions[inside]
        firsts = self.teacher_start + self.source[several] - 1
        counts, ids = self.spans_several[several], self.student_ids[several]
        return np.stack([positions, firsts, counts, ids], axis=1).reshape(-1, 4)


@dataclass
class TeacherRows:
    """The teacher's rows of a batch, and each assistant turn's alignment."""

    batch: object
    """TensorBatch: input_ids [B, S_t], input_lengths [B], token_mask, sample_mask."""
    logs: list[list[Message]]
    """The teacher's conversations."""
    turns: list[list[TurnPair]] = field(default_factory=list)
    """Per row, its assistant turns."""
    unrendered_rows: list[bool] = field(default_factory=list)
    """Per row: the teacher's template could not render it (not graded)."""
    truncated_rows: list[bool] = field(default_factory=list)
    """Per row: cut at the teacher's longest row (graded up to the cut)."""
    _sources: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @property
    def unrendered(self) -> int:
        """Rows the teacher's template could not render."""
        return sum(self.unrendered_rows)

    @property
    def truncated(self) -> int:
        """Rows cut at the teacher's longest row."""
        return sum(self.truncated_rows)

    def source_positions(self, width: int) -> torch.Tensor:
        """[B, width] int64: for each student position, the teacher position whose top-k
        grades it (-1: none). Computed once per width."""
        if width not in self._sources:
            self._sources[width] = torch.from_numpy(self._source_positions(width))
        return self._sources[width]

    def _source_positions(self, width: int) -> np.ndarray:
        source = np.full((len(self.turns), width), -1, dtype=np.int64)
        for row, pairs in enumerate(self.turns):
            for pair in pairs:
                graded = np.flatnonzero(pair.source >= 0)
                at = pair.student_start + graded - 1
                keep = at >= 0
                source[row, at[keep]] = pair.teacher_start + pair.source[graded[keep]] - 1
                if pair.end_of_turn:
                    eos = pair.student_start + pair.num_student
                    source[row, eos - 1] = pair.teacher_start + pair.num_teacher - 1
        return source

    def chains(self, width: int) -> tuple[torch.Tensor, ...]:
        """The student positions whose next token spans several teacher tokens, as flat
        tensors [n]: (row, student position, first teacher position, teacher token count,
        the student's sampled id)."""
        tables = [
            np.concatenate([np.full((len(found), 1), row), found], axis=1)
            for row, pairs in enumerate(self.turns)
            for found in (pair.chains(width) for pair in pairs)
        ]
        table = np.concatenate([np.zeros((0, 5), dtype=np.int64), *tables]).astype(np.int64)
        return tuple(torch.from_numpy(table).unbind(1))

    def topk_to_student(
        self, values: torch.Tensor, indices: torch.Tensor, width: int, vocab: VocabMap
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, S_t, k] teacher top-k (teacher ids) -> [B, width, k] in the student's positions
        and vocabulary (empty slots where the teacher has no distribution; one slot, the
        sampled token's chain-rule log-prob, where it spans several teacher tokens)."""
        source = self.source_positions(width)
        k = values.shape[-1]
        out_values = torch.full((len(self.turns), width, k), float("-inf"))
        out_ids = torch.full((len(self.turns), width, k), EMPTY_INDEX, dtype=torch.int32)
        rows, positions = (source >= 0).nonzero(as_tuple=True)  # only the graded positions
        teacher_positions = source[rows, positions]
        mapped = vocab.map_topk(
            values[rows, teacher_positions].float(), indices[rows, teacher_positions].long()
        )
        out_values[rows, positions], out_ids[rows, positions] = mapped
        self._write_chains(values, indices, width, out_values, out_ids)
        return out_values, out_ids

    def _write_chains(self, values, indices, width, out_values, out_ids) -> None:
        """Positions whose next student token spans several teacher tokens: one slot, the
        sampled id with the sum of the teacher's log-probs of those tokens, read from its top-k
        at each (a token outside a top-k leaves the position empty: its log-prob is unknown)."""
        rows, positions, firsts, counts, student_ids = self.chains(width)
        if len(rows) == 0:
            return
        next_ids = self.batch["input_ids"].roll(-1, dims=1)  # the token each position predicts
        hit = indices.long() == next_ids.unsqueeze(-1)
        token_lp = torch.where(hit, values.float(), 0.0).sum(-1)  # [B, S_t]
        missing = (~hit.any(-1)).long()
        running = torch.nn.functional.pad(token_lp.double().cumsum(1), (1, 0))
        misses = torch.nn.functional.pad(missing.cumsum(1), (1, 0))
        total = (running[rows, firsts + counts] - running[rows, firsts]).float()
        unknown = misses[rows, firsts + counts] > misses[rows, firsts]
        total = total.masked_fill(unknown, float("-inf"))
        out_values[rows, positions] = float("-inf")
        out_ids[rows, positions] = EMPTY_INDEX
        known = total > float("-inf")
        out_values[rows[known], positions[known], 0] = total[known]
        out_ids[rows[known], positions[known], 0] = student_ids[known].to(out_ids.dtype)

    def logprobs_to_student(self, logprobs: torch.Tensor, width: int) -> torch.Tensor:
        """[B, S_t] teacher log-probs (position t scores token t + 1) -> [B, width]: each
        student token's share of its aligned group's log-probability (the rendering
        module docstring)."""
        out = np.zeros((len(self.turns), width))
        table = logprobs.float().numpy()
        for row, pairs in enumerate(self.turns):
            for pair in pairs:
                first = pair.teacher_start
                token_lp = np.zeros(pair.num_teacher)
                kept = pair.num_teacher if pair.kept < 0 else pair.kept
                token_lp[:kept] = table[row, first - 1 : first - 1 + kept]
                shares = spread_over_groups(pair.student_group, pair.teacher_group, token_lp)
                if kept < pair.num_teacher:  # a group with a token past the row's end: unknown
                    cut_groups = np.unique(pair.teacher_group[kept:])
                    shares[np.isin(pair.student_group, cut_groups)] = 0.0
                at = pair.student_start - 1
                out[row, at : at + pair.num_student] = shares
                if pair.end_of_turn:
                    eos = pair.student_start + pair.num_student
                    out[row, eos - 1] = table[row, first + pair.num_teacher - 1]
        return torch.from_numpy(out).float()

    def counts(
        self,
        token_mask: torch.Tensor,
        topk: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """[B, len(COUNTS)] float64: the counts behind the cross-tokenizer metrics, per row.

        Args:
            token_mask: [B, width] the student's assistant tokens (1) in its rows.
            topk: (the teacher's top-k log-probs [B, S_t, k], the same moved onto the
                student's positions [B, width, k] by topk_to_student), when scored.
        """
        out = torch.zeros(len(self.turns), len(COUNTS), dtype=torch.float64)
        out[:, COUNTS.index("unrendered")] = torch.tensor(self.unrendered_rows, dtype=torch.bool)
        out[:, COUNTS.index("truncated")] = torch.tensor(self.truncated_rows, dtype=torch.bool)
        if topk is None:
            return out
        width = token_mask.shape[1]
        source = self.source_positions(width)
        chained = torch.zeros(source.shape, dtype=torch.bool)
        chain_rows, chain_positions, *_ = self.chains(width)
        chained[chain_rows, chain_positions] = True
        predicting = token_mask.roll(-1, dims=1) > 0  # positions predicting a turn's token
        graded = (source >= 0) & predicting
        out[:, COUNTS.index("predicting")] = predicting.sum(1).double()
        out[:, COUNTS.index("graded")] = graded.sum(1).double()
        out[:, COUNTS.index("chained")] = (chained & graded).sum(1).double()
        whole = (source >= 0) & ~chained  # graded by a whole distribution
        rows, positions = whole.nonzero(as_tuple=True)
        before, after = topk
        total = before[rows, source[rows, positions]].float().exp().sum(-1)
        kept = after[rows, positions].exp().sum(-1)
        share = (kept / total.clamp_min(1e-12)).double()
        out[:, COUNTS.index("mapped_mass")].index_add_(0, rows, share)
        out[:, COUNTS.index("mapped")] = whole.sum(1).double()
        return out
