"""A teacher with another tokenizer (and chat template): the student's rollouts in its tokens.

The student's conversation is rendered for the teacher with the teacher's own chat template and
tokenizer (`TeacherRendering`): its openings and environment replies as the teacher's template
writes them, each assistant turn as the text the student wrote followed by the teacher's own end
of turn. Each assistant turn's tokens on both sides are placed on the turn's characters and
aligned (nemo_opd.teachers.xtok_align); the teacher's answers come back in the student's
positions (`TeacherRows`):

- top-k: at a student position whose next token starts where a teacher token starts, the
  teacher's top-k there, moved onto the student's vocabulary (nemo_opd.teachers.xtok_vocab:
  exact matches; the rest of the mass in the tail). The student's end of turn reads the
  teacher's end of turn. Elsewhere (the next student token starts inside a teacher token) the
  teacher has no distribution: every slot is empty, which the loss counts as 0.
- sampled log-probs: the teacher's log-probability of the text the student sampled, per aligned
  group of tokens, shared evenly by the group's student tokens; the end of turn as its own
  group.

Positions outside the assistant turns (never trained) are 0, as past a row's end.

    rendering = TeacherRendering(student_tokenizer, teacher_formatter, teacher_vocab_size)
    rows = rendering.teacher_rows(message_logs)
    values, indices = teacher.get_topk_logits(rows.batch, k)    # the teacher's positions
    values, indices = rows.topk_to_student(values, indices, width, rendering.vocab_map())
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from transformers import PreTrainedTokenizerBase

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import Message, flatten_message_logs
from nemo_opd.errors import SetupError
from nemo_opd.losses.checks import EMPTY_INDEX
from nemo_opd.teachers.base import Rollouts, Teacher, TeacherNeed, TeacherScores
from nemo_opd.teachers.xtok_align import (
    Span,
    align_groups,
    spread_over_groups,
    teacher_starts,
    token_spans,
)
from nemo_opd.teachers.xtok_vocab import VocabMap, token_bytes

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy


@dataclass
class TurnPair:
    """One assistant turn on both sides: where its tokens sit in each row and how they align."""

    student_start: int
    """Row position of the turn's first student token."""
    teacher_start: int
    """Row position of the turn's first teacher token."""
    student_spans: list[Span]
    """Characters of each student content token (the end of turn excluded)."""
    teacher_spans: list[Span]
    """Characters of each teacher content token."""
    end_of_turn: bool
    """Both sides close the turn with their end-of-turn token, right after the content."""


@dataclass
class TeacherRows:
    """The teacher's rows of a batch, and each assistant turn's alignment."""

    batch: object
    """TensorBatch: input_ids [B, S_t], input_lengths [B], token_mask, sample_mask."""
    logs: list[list[Message]]
    """The teacher's conversations."""
    turns: list[list[TurnPair]] = field(default_factory=list)
    """Per row, its assistant turns."""
    _sources: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    def source_positions(self, width: int) -> torch.Tensor:
        """[B, width] int64: for each student position, the teacher position whose top-k
        grades it (-1: none). Computed once per width."""
        if width not in self._sources:
            self._sources[width] = self._source_positions(width)
        return self._sources[width]

    def _source_positions(self, width: int) -> torch.Tensor:
        source = torch.full((len(self.turns), width), -1, dtype=torch.int64)
        for row, pairs in enumerate(self.turns):
            for pair in pairs:
                starts = teacher_starts(pair.student_spans, pair.teacher_spans)
                for j, t in enumerate(starts):
                    if t >= 0 and pair.student_start + j >= 1:
                        source[row, pair.student_start + j - 1] = pair.teacher_start + t - 1
                if pair.end_of_turn:
                    eos = pair.student_start + len(pair.student_spans)
                    source[row, eos - 1] = pair.teacher_start + len(pair.teacher_spans) - 1
        return source

    def topk_to_student(
        self, values: torch.Tensor, indices: torch.Tensor, width: int, vocab: VocabMap
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """[B, S_t, k] teacher top-k (teacher ids) -> [B, width, k] in the student's positions
        and vocabulary (empty slots where the teacher has no distribution)."""
        source = self.source_positions(width)
        has = source >= 0
        picked = source.clamp_min(0).unsqueeze(-1).expand(-1, -1, values.shape[-1])
        moved_values = values.float().gather(1, picked)
        moved_ids = indices.long().gather(1, picked)
        out_values, out_ids = vocab.map_topk(moved_values, moved_ids)
        out_values = out_values.masked_fill(~has.unsqueeze(-1), float("-inf"))
        out_ids = out_ids.masked_fill(~has.unsqueeze(-1), EMPTY_INDEX)
        return out_values, out_ids

    def logprobs_to_student(self, logprobs: torch.Tensor, width: int) -> torch.Tensor:
        """[B, S_t] teacher log-probs (position t scores token t + 1) -> [B, width]: each
        student token's share of its aligned group's log-probability (module docstring)."""
        out = torch.zeros(len(self.turns), width)
        for row, pairs in enumerate(self.turns):
            for pair in pairs:
                first = pair.teacher_start
                token_lp = [
                    float(logprobs[row, first + t - 1]) if first + t >= 1 else 0.0
                    for t in range(len(pair.teacher_spans))
                ]
                groups = align_groups(pair.student_spans, pair.teacher_spans)
                shares = spread_over_groups(groups, token_lp, len(pair.student_spans))
                for j, share in enumerate(shares):
                    if pair.student_start + j >= 1:
                        out[row, pair.student_start + j - 1] = share
                if pair.end_of_turn:
                    eos = pair.student_start + len(pair.student_spans)
                    teacher_eos = first + len(pair.teacher_spans)
                    out[row, eos - 1] = float(logprobs[row, teacher_eos - 1])
        return out


class TeacherRendering:
    """Renders the student's conversations in the teacher's tokens (module docstring).

    Args:
        student_tokenizer: the student's tokenizer (its ids are the rollouts').
        formatter: the teacher's ChatFormatter: its tokenizer, chat template and system prompt.
        teacher_vocab_size: the teacher model's vocabulary, padded ids included (None: its
            tokenizer's, as for a served teacher).
    """

    def __init__(
        self,
        student_tokenizer: PreTrainedTokenizerBase,
        formatter: ChatFormatter,
        teacher_vocab_size: int | None = None,
    ):
        self.student = student_tokenizer
        self.formatter = formatter
        self.teacher = formatter.tokenizer
        self.teacher_vocab_size = teacher_vocab_size
        self._vocab: VocabMap | None = None

    def vocab_map(self) -> VocabMap:
        """The teacher's vocabulary on the student's, its end of turn on the student's (built
        on first use: it decodes every id of both vocabularies)."""
        if self._vocab is None:
            specials = {}
            if self.teacher.eos_token_id is not None and self.student.eos_token_id is not None:
                specials[self.teacher.eos_token_id] = self.student.eos_token_id
            self._vocab = VocabMap.from_tokenizers(
                self.student, self.teacher, specials, self.teacher_vocab_size
            )
        return self._vocab

    def check(self) -> None:
        """Render a probe conversation once, so that a teacher template that rewrites the
        student's text, or a tokenizer that merges it with the end of turn, is refused at setup
        rather than at the first step (SetupError)."""
        opening = ChatFormatter(self.student).prompt_log("What is 2 + 2?")
        ids = self.student.encode("2 + 2 = 4. \\boxed{4}", add_special_tokens=False)
        if self.student.eos_token_id is not None:
            ids.append(self.student.eos_token_id)
        self.teacher_rows([[*opening, {"role": "assistant", "content": "", "token_ids": ids}]])

    def unspellable(self) -> list[str]:
        """The student tokens whose text the teacher's tokenizer cannot write (it would read
        them as its unknown token): text the student can produce and the teacher cannot read."""
        unknown = self.teacher.unk_token_id
        if unknown is None:
            return []  # byte-level or byte-fallback: every text has a spelling
        texts = token_bytes(self.student)
        out = []
        for key in texts.values():
            text = key.decode("utf-8", errors="ignore")
            if text and unknown in self.teacher.encode(text, add_special_tokens=False):
                out.append(text)
        return out

    def teacher_rows(self, logs: list[list[Message]]) -> TeacherRows:
        rendered = [self._row(log) for log in logs]
        teacher_logs = [log for log, _ in rendered]
        pad = self.teacher.pad_token_id
        pad = pad if pad is not None else (self.teacher.eos_token_id or 0)
        return TeacherRows(
            batch=flatten_message_logs(teacher_logs, pad),
            logs=teacher_logs,
            turns=[turns for _, turns in rendered],
        )

    def _row(self, log: list[Message]) -> tuple[list[Message], list[TurnPair]]:
        teacher_log: list[Message] = []
        turns: list[TurnPair] = []
        student_at = 0
        pending: list[Message] = []  # non-assistant messages waiting for their turn
        for message in log:
            if message["role"] != "assistant":
                pending.append(message)
                student_at += len(message["token_ids"])
                continue
            if pending:
                teacher_log = self.formatter.extend(teacher_log, pending)
                pending = []
            teacher_at = sum(len(m["token_ids"]) for m in teacher_log)
            turn, pair = self._assistant_turn(teacher_log, message, student_at, teacher_at)
            teacher_log = [*teacher_log, turn]
            turns.append(pair)
            student_at += len(message["token_ids"])
        if pending:  # an environment's last reply: the teacher reads it too
            teacher_log = self.formatter.extend(teacher_log, pending)
        return teacher_log, turns

    def _assistant_turn(
        self, history: list[Message], message: Message, student_at: int, teacher_at: int
    ) -> tuple[Message, TurnPair]:
        ids = list(message["token_ids"])
        end_of_turn = bool(ids) and ids[-1] == self.student.eos_token_id
        content_ids = ids[:-1] if end_of_turn else ids
        text, student_spans = token_spans(self.student, content_ids)
        piece = self.formatter.assistant_text(history, text) if end_of_turn else text
        if not piece.startswith(text):
            raise SetupError(_REWRITTEN.format(text=text[:40]))
        encoded = self.teacher(piece, add_special_tokens=False, return_offsets_mapping=True)
        teacher_ids = encoded["input_ids"]
        offsets = [tuple(span) for span in encoded["offset_mapping"]]
        inside = [i for i, (a, _) in enumerate(offsets) if a < len(text)]
        count = (inside[-1] + 1) if inside else 0
        if count and offsets[count - 1][1] > len(text):
            # the teacher merges the content's last characters with its end of turn
            raise SetupError(_MERGED.format(text=text[-20:], closing=piece[len(text) :]))
        _, teacher_spans = token_spans(self.teacher, teacher_ids[:count])
        closes = end_of_turn and teacher_ids[count : count + 1] == [self.teacher.eos_token_id]
        pair = TurnPair(student_at, teacher_at, student_spans, teacher_spans, closes)
        turn = {"role": "assistant", "content": text, "token_ids": teacher_ids}
        return turn, pair


_MERGED = (
    "the teacher's tokenizer merges the end of an assistant turn ({text!r}) with its chat "
    "template's end of turn ({closing!r}): a teacher with another tokenizer needs the end of "
    "turn as a token of its own"
)
_REWRITTEN = (
    "the teacher's chat template does not write an assistant turn's text as it is (it changes "
    "{text!r}...): a teacher with another tokenizer reads the student's text through it; use a "
    "template that writes the content verbatim (teacher.tokenizer.chat_template)"
)


class CrossTokenizerTeacher:
    """Any teacher, reading the student's rollouts in its own tokens and answering in the
    student's positions and vocabulary (the Teacher interface)."""

    def __init__(self, inner: Teacher, rendering: TeacherRendering) -> None:
        self.inner = inner
        self.rendering = rendering
        self.vocab = rendering.vocab_map()
        self._mapped: list[float] = []
        self._graded: list[float] = []

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        rows = self.rendering.teacher_rows(rollouts.message_logs)
        scores = self.inner.score(Rollouts(rows.batch, rows.logs, rollouts.metadata), need)
        width = rollouts.batch["input_ids"].shape[1]
        out = TeacherScores()
        if scores.topk_logprobs is not None:
            out.topk_logprobs, out.topk_indices = rows.topk_to_student(
                scores.topk_logprobs, scores.topk_indices, width, self.vocab
            )
            self._note_mapped_mass(scores.topk_logprobs, out.topk_logprobs, rows, width)
            predicting = rollouts.batch["token_mask"].roll(-1, dims=1) > 0  # the turns' tokens
            graded = (rows.source_positions(width) >= 0) & predicting
            self._graded.append(float(graded.sum()) / max(1.0, float(predicting.sum())))
        if scores.logprobs is not None:
            out.logprobs = rows.logprobs_to_student(scores.logprobs, width)
        return out

    def _note_mapped_mass(self, before, after, rows: TeacherRows, width: int) -> None:
        """The share of the teacher's top-k mass that maps to student ids, over the graded
        positions (teacher/xtok_mapped_mass)."""
        source = rows.source_positions(width)
        graded = source >= 0
        if not graded.any():
            return
        total = before.float().gather(
            1, source.clamp_min(0).unsqueeze(-1).expand(-1, -1, before.shape[-1])
        ).exp().sum(-1)  # fmt: skip
        kept = after.exp().sum(-1)
        self._mapped.append(float((kept[graded] / total[graded].clamp_min(1e-12)).mean()))

    def workers(self) -> dict[str, Policy]:
        return self.inner.workers()

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return self.inner.groups(metadata)

    def take_metrics(self) -> dict[str, float]:
        metrics = self.inner.take_metrics()
        if self._mapped:
            metrics["teacher/xtok_mapped_mass"] = sum(self._mapped) / len(self._mapped)
            self._mapped = []
        if self._graded:
            metrics["teacher/xtok_graded_share"] = sum(self._graded) / len(self._graded)
            self._graded = []
        return metrics

    def shutdown(self) -> None:
        self.inner.shutdown()
