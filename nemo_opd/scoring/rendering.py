"""The student's rollouts in the tokens of a teacher with another tokenizer (and chat template).

The student's conversation is rendered for the teacher with the teacher's own chat template and
tokenizer (`TeacherRendering`): its openings and environment replies as the teacher's template
writes them (the last with the template's generation prompt); each assistant turn as the bytes
the student wrote, verbatim, right after that generation prompt (as the teacher would read its
own sampled text: a template that trims or rewrites a finished turn's content does not apply),
control strings in them read as text, then the template's own end of turn. Each assistant
turn's tokens on both sides are aligned by byte offsets (nemo_opd.scoring.xtok_align); the
teacher's answers come back in the student's positions (`TeacherRows`):

- top-k: at a student position whose next token starts where a teacher token starts, the
  teacher's top-k there, moved onto the student's vocabulary (nemo_opd.scoring.xtok_vocab: each
  teacher token to the student token its text starts with; the rest of the mass in the tail).
  Where the student's next token spans several teacher tokens (a Llama 3 "121" over a Qwen
  teacher's "1", "2", "1"), the teacher's top-k cannot say how much of its mass continues as
  that token: the position keeps one slot, the sampled token with the teacher's chain-rule
  log-prob of its bytes, and leaves the rest to the tail. The student's end of turn reads the
  teacher's end of turn (the token its template closes a turn with). Elsewhere (the next
  student token starts inside a teacher token) the teacher has no distribution: every slot is
  empty, which the loss counts as 0.
- sampled log-probs: the teacher's log-probability of the text the student sampled, per aligned
  group of tokens, shared evenly by the group's student tokens; the end of turn as its own
  group.

A response that is not whole UTF-8 (cut inside a character) is read up to its last whole
character. A conversation the teacher's template cannot render (RENDER_ERRORS: roles it
refuses, which its template raises on; text that is not valid Unicode, such as a lone surrogate
a tool result echoed, which no tokenizer encodes) is not graded at all and counted
(`teacher/xtok_unrendered_rows`; past teacher.max_unrendered_share of a step's rows the run
stops: nemo_opd.teachers.cross_tokenizer); any other exception is a bug and ends the run where
it is raised. One longer in the teacher's tokens than a
served teacher's context (teacher.max_total_sequence_length: a teacher with finer tokens
writes more of them) is cut there, graded up to the cut and counted
(`teacher/xtok_truncated_rows`); the run goes on. Positions outside the assistant turns (never
trained) are 0, as past a row's end.

Where it runs (`score_rendered`): a teacher with workers of its own (in process) renders,
scores and maps in each data-parallel worker, on that worker's rows (Policy.score_rendered), so
that the driver only ships conversations and collects answers; a served teacher's rows are
rendered, scored and mapped by a pool of render workers (nemo_opd.scoring.render_pool), or on
the driver's thread (CrossTokenizerTeacher, nemo_opd.teachers.cross_tokenizer). The answers are
the same wherever it runs, bit for bit. This module stands below both the policy's workers and
the teachers, which import it.

    rendering = TeacherRendering(student_tokenizer, teacher_formatter, teacher_vocab_size)
    rows = rendering.teacher_rows(message_logs)
    values, indices = teacher.get_topk_logits(rows.batch, k)    # the teacher's positions
    values, indices = rows.topk_to_student(values, indices, width, rendering.vocab_map())
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from jinja2 import TemplateError
from transformers import PreTrainedTokenizerBase

from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import Message, flatten_message_logs
from nemo_opd.errors import SetupError
from nemo_opd.scoring.base import TeacherNeed, TeacherScores
from nemo_opd.scoring.xtok_align import (
    char_starts,
    filled_ends,
    group_ids,
    running_starts,
    sources,
)
from nemo_opd.scoring.xtok_rows import TeacherRows, TurnPair
from nemo_opd.scoring.xtok_vocab import (
    ByteTable,
    VocabMap,
    encode_as_text,
    is_byte_complete,
    special_ids,
    token_bytes,
)

PROBE_RESPONSE = "  2 + 2 = 4 ≈ 4.0 🎉\n\\boxed{4} <|im_end|> [INST] </s>\n"
"""The probe's assistant turn (setup's check): outer whitespace, a multi-byte character, an
emoji, and control strings as text, which templates and tokenizers each treat their own way."""


class UnrenderableText(ValueError):
    """A message of a conversation holds text that is not valid Unicode (a lone surrogate, as
    a tool result can echo from a JSON escape in the model's call): no tokenizer encodes it."""


RENDER_ERRORS = (TemplateError, SetupError, UnrenderableText)
"""What real conversations raise when the teacher's template cannot render them: the
template's own refusal (jinja2's TemplateError: raise_exception, an undefined field), the
ChatFormatter's SetupError for a turn the template does not write, and UnrenderableText."""


@dataclass
class _Content:
    """An assistant turn's content as the student wrote it."""

    ids: np.ndarray
    """[n_s] int64: the student's content ids (its end-of-turn token apart)."""
    lengths: np.ndarray
    """[n_s] int64: each id's bytes in the text."""
    text: str
    """The text, up to its last whole character."""
    end_of_turn: bool
    """The student closed the turn."""


class TeacherRendering:
    """Renders the student's conversations in the teacher's tokens (module docstring).

    Args:
        student_tokenizer: the student's tokenizer (its ids are the rollouts').
        formatter: the teacher's ChatFormatter: its tokenizer, chat template and system prompt.
        teacher_vocab_size: the teacher model's vocabulary, padded ids included (None: its
            tokenizer's, as for a served teacher).
        system_prompt: the run's system prompt (data.system_prompt_file), in setup's probe.
        max_length: the longest row the teacher scores (a served teacher's context,
            teacher.max_total_sequence_length): a conversation longer in the teacher's tokens
            is cut there, the rest of it not graded, and counted (`truncated`); None: no
            limit (an in-process teacher scores any length).
    """

    def __init__(
        self,
        student_tokenizer: PreTrainedTokenizerBase,
        formatter: ChatFormatter,
        teacher_vocab_size: int | None = None,
        system_prompt: str | None = None,
        max_length: int | None = None,
    ):
        self.student = student_tokenizer
        self.max_length = max_length
        self.formatter = formatter
        self.teacher = formatter.tokenizer
        self.teacher_vocab_size = teacher_vocab_size
        self.system_prompt = system_prompt
        self._vocab: VocabMap | None = None
        self._student_bytes = _bytes_by_id(student_tokenizer)
        self._student_table = ByteTable(self._student_bytes)
        self._teacher_table = ByteTable(token_bytes(self.teacher))
        self._closings: dict[tuple[str, ...], tuple[list[int], int | None]] = {}
        self._teacher_special = special_ids(self.teacher)
        self._strip_lead = _decoder_strips_a_space(student_tokenizer)
        self.student_ends = {student_tokenizer.eos_token_id} - {None}

    def vocab_map(self) -> VocabMap:
        """The teacher's vocabulary on the student's, its end of turn (the token its template
        closes a turn with, and its eos token) on the student's eos (built on first use)."""
        if self._vocab is None:
            specials = {}
            student_eos = self.student.eos_token_id
            if student_eos is not None:
                for teacher_id in (self.teacher.eos_token_id, self.teacher_turn_end()):
                    if teacher_id is not None:
                        specials[teacher_id] = student_eos
            self._vocab = VocabMap.from_tokenizers(
                self.student, self.teacher, specials, self.teacher_vocab_size
            )
        return self._vocab

    def teacher_turn_end(self) -> int | None:
        """The special token the teacher's template closes an assistant turn with (None if
        its closing does not start with one)."""
        opening = self._probe_opening()
        return self._closing(opening)[1]

    def check(self) -> None:
        """Render a probe conversation once (with the run's system prompt, a response with
        outer whitespace, multi-byte characters and control strings), so that a teacher
        template that cannot render the run's conversations is refused at setup (SetupError)
        rather than left ungraded at every step."""
        encoded = self.student(PROBE_RESPONSE, add_special_tokens=False, split_special_tokens=True)
        ids = encoded["input_ids"] + [i for i in [self.student.eos_token_id] if i is not None]
        opening = self._student_opening()
        log = [*opening, {"role": "assistant", "content": PROBE_RESPONSE, "token_ids": ids}]
        try:
            self._row(log)
        except SetupError:
            raise
        except RENDER_ERRORS as error:
            shown = " with a system message" if self.system_prompt is not None else ""
            raise SetupError(
                f"the teacher's chat template cannot render a conversation{shown} like the "
                f"run's ({type(error).__name__}: {error}); set teacher.tokenizer.chat_template "
                "to one that does, or change data.system_prompt_file"
            ) from error

    def _student_opening(self) -> list[Message]:
        return ChatFormatter(self.student, system_prompt=self.system_prompt).prompt_log(
            "What is 2 + 2?"
        )

    def _probe_opening(self) -> list[Message]:
        formatter = ChatFormatter(self.teacher, template_kwargs=self.formatter.template_kwargs)
        return formatter.prompt_log("What is 2 + 2?")

    def unspellable(self) -> list[str]:
        """The student tokens whose text the teacher's tokenizer cannot write (it would read
        them as its unknown token): text the student can produce and the teacher cannot read.
        A byte-level or byte-fallback teacher spells everything; others are checked in one
        batched call."""
        unknown = self.teacher.unk_token_id
        if unknown is None or is_byte_complete(self.teacher):
            return []
        texts = [key.decode("utf-8", errors="ignore") for key in self._student_bytes.values()]
        texts = [text for text in texts if text]
        encoded = self.teacher(texts, add_special_tokens=False, split_special_tokens=True)
        return [t for t, ids in zip(texts, encoded["input_ids"], strict=True) if unknown in ids]

    def teacher_rows(self, logs: list[list[Message]]) -> TeacherRows:
        """The teacher's rows of these conversations; one its template cannot render
        (RENDER_ERRORS) is a single padding token with no turns (not graded, counted in
        `unrendered`); any other error is raised. Every
        assistant turn's text is tokenized for the teacher in one batched call (the
        tokenizer's Rust core, on all cores)."""
        contents = [[self._content(m) for m in log if m["role"] == "assistant"] for log in logs]
        encoded = self._encode([c for row in contents for c in row])
        pad = self.teacher.pad_token_id
        pad = pad if pad is not None else (self.teacher.eos_token_id or 0)
        rows = TeacherRows(batch=None, logs=[])
        for log, row_contents in zip(logs, contents, strict=True):
            pairs = list(zip(row_contents, (next(encoded) for _ in row_contents), strict=True))
            unrendered, truncated = False, False
            try:
                teacher_log, turns = self._row(log, pairs)
            except RENDER_ERRORS:  # this conversation is not graded; a bug is raised
                unrendered = True
                teacher_log, turns = [{"role": "user", "content": "", "token_ids": [pad]}], []
            if self.max_length is not None and _length(teacher_log) > self.max_length:
                teacher_log, truncated = _cut(teacher_log, turns, self.max_length), True
            rows.logs.append(teacher_log)
            rows.turns.append(turns)
            rows.unrendered_rows.append(unrendered)
            rows.truncated_rows.append(truncated)
        rows.batch = flatten_message_logs(rows.logs, pad)
        return rows

    def _row(
        self, log: list[Message], contents: list[tuple[_Content, tuple]] | None = None
    ) -> tuple[list[Message], list[TurnPair]]:
        """One conversation for the teacher; `contents`: each assistant turn's content and its
        teacher encoding (computed here when not given)."""
        _check_text(log)
        if contents is None:
            mine = [self._content(m) for m in log if m["role"] == "assistant"]
            contents = list(zip(mine, self._encode(mine), strict=True))
        turn_contents = iter(contents)
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
            content, encoding = next(turn_contents)
            turn, pair = self._assistant_turn(
                teacher_log, content, encoding, student_at, teacher_at
            )
            teacher_log = [*teacher_log, turn]
            turns.append(pair)
            student_at += len(message["token_ids"])
        if pending:  # an environment's last reply: the teacher reads it too
            teacher_log = self.formatter.extend(teacher_log, pending)
        return teacher_log, turns

    def _content(self, message: Message) -> _Content:
        """An assistant turn's content as the student wrote it: its ids (the end of turn
        apart), each id's byte length, and its text (whole characters)."""
        ids = np.asarray(message["token_ids"], dtype=np.int64)
        end_of_turn = len(ids) > 0 and int(ids[-1]) in self.student_ends
        content_ids = ids[:-1] if end_of_turn else ids
        lengths = self._student_table.byte_lengths(content_ids)
        data = self._student_table.join(content_ids)
        if self._strip_lead and data.startswith(b" "):  # the decoder drops it: not the text
            data, lengths[0] = data[1:], lengths[0] - 1
        return _Content(content_ids, lengths, _whole_characters(data), end_of_turn)

    def _encode(self, contents: list[_Content]):
        """An iterator of (teacher ids, character offsets) for each content's text, control
        strings read as text: one batched call into the tokenizer's Rust core."""
        encoded = encode_as_text(self.teacher, [c.text for c in contents])
        return ((e.ids, e.offsets) for e in encoded)

    def _assistant_turn(
        self,
        history: list[Message],
        content: _Content,
        encoding: tuple,
        student_at: int,
        teacher_at: int,
    ) -> tuple[Message, TurnPair]:
        teacher_ids, offsets = encoding
        text = content.text
        if self._teacher_table.join(teacher_ids) == text.encode():
            t_starts = running_starts(self._teacher_table.byte_lengths(teacher_ids))
        else:  # the teacher's tokenizer normalized the text: place its tokens by offsets
            t_starts = char_starts(offsets, text)
        s_starts = running_starts(content.lengths)
        source = sources(s_starts, t_starts)
        several = _spans_several(source, s_starts, t_starts)
        source[several == 0] = -1  # ends inside a later teacher token: no signal
        s_group, t_group = group_ids(s_starts, t_starts)
        closing, teacher_end = self._closing(history)
        pair = TurnPair(
            student_at,
            teacher_at,
            source,
            several,
            s_group,
            t_group,
            content.ids,
            content.end_of_turn and teacher_end is not None,
        )
        turn = {"role": "assistant", "content": text, "token_ids": list(teacher_ids) + closing}
        return turn, pair

    def _closing(self, history: list[Message]) -> tuple[list[int], int | None]:
        """The ids the teacher's template writes after an assistant turn's content (up to and
        including its eos token, if there) and the special token it starts with (the turn's
        end; None if it starts with none). Cached by the roles of the conversation before
        the turn (templates close a turn by role and place, not by content)."""
        key = tuple(m["role"] for m in history)
        if key not in self._closings:
            text = self.formatter.closing_text(history)
            closing = self.teacher(text, add_special_tokens=False)["input_ids"]
            first = closing[0] if closing and closing[0] in self._teacher_special else None
            self._closings[key] = (closing, first)
        return self._closings[key]


def _check_text(log: list[Message]) -> None:
    """UnrenderableText when the text the template writes of a message other than an
    assistant turn (its role, content, a tool's name: what ChatFormatter renders) is not valid
    Unicode. An assistant turn is read from its bytes, always valid."""
    for message in log:
        if message["role"] == "assistant":
            continue
        for key in ("role", "content", "name"):
            value = message.get(key)
            if isinstance(value, str) and not _is_unicode(value):
                raise UnrenderableText(
                    f"a {message['role']!r} message's {key} holds text that is not valid "
                    "Unicode (a lone surrogate)"
                )


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _length(log: list[Message]) -> int:
    return sum(len(m["token_ids"]) for m in log)


def _cut(log: list[Message], turns: list[TurnPair], length: int) -> list[Message]:
    """The conversation's first `length` tokens (messages past them dropped, the one across
    cut), its turns cut to match (TurnPair.cut_at)."""
    out, left = [], length
    for message in log:
        if left <= 0:
            break
        out.append(dict(message, token_ids=list(message["token_ids"][:left])))
        left -= len(out[-1]["token_ids"])
    for pair in turns:
        pair.cut_at(length)
    return out


def _spans_several(source: np.ndarray, student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
    """[n_s] int64: for each graded student token, how many teacher tokens from the one at its
    start it covers: 1 where it ends inside or at the end of that first one, the count where
    it ends exactly where a later one ends, 0 where it ends inside a later one (no signal)."""
    out = np.ones(len(source), dtype=np.int64)
    graded = np.flatnonzero(source >= 0)
    if len(graded) == 0:
        return out
    ends = filled_ends(teacher)
    s_ends = student[1:][graded]
    last = np.searchsorted(ends, s_ends, side="left").clip(max=len(ends) - 1)
    count = last - source[graded] + 1
    exact = ends[last] == s_ends
    out[graded] = np.where(count <= 1, 1, np.where(exact, count, 0))
    return out


def _whole_characters(data: bytes) -> str:
    """The text of `data` up to its first byte that is not part of a whole UTF-8 character
    (a response cut inside a character, or sampled bytes that form none)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        return data[: error.start].decode("utf-8")


def _bytes_by_id(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes]:
    """Every id's bytes, special tokens as their text (in a student's turn they are text)."""
    table = token_bytes(tokenizer)
    for index in special_ids(tokenizer):
        table[index] = str(tokenizer.convert_ids_to_tokens(index)).encode()
    return table


def _decoder_strips_a_space(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether decoding drops the leading space of a text (SentencePiece's Strip decoder)."""
    decoder = repr(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None))
    return "Strip(" in decoder


def rendered_fields(message: Message) -> Message:
    """A message without its generation log-probs (one per token, never read by a teacher):
    what a worker that renders is sent."""
    return {key: value for key, value in message.items() if key != "generation_logprobs"}


XTOK_COUNTS = "xtok_counts"
"""The key of score_rendered's per-row counts (TeacherRows.counts, columns COUNTS)."""


def score_rendered(
    rendering: TeacherRendering,
    batch: TensorBatch,
    logs: list[list[Message]],
    need: TeacherNeed,
    score_rows: Callable[[TeacherRows], TeacherScores],
) -> dict[str, torch.Tensor]:
    """The student's rows scored by a teacher with another tokenizer: the conversations
    rendered in its tokens, scored there by `score_rows`, the answers moved onto the student's
    positions. What a teacher's worker runs on its own rows, or the driver for a teacher
    without workers (a served one).

    Args:
        rendering: how the teacher reads the student's conversations.
        batch: the student's rows: input_ids [B, S], token_mask [B, S].
        logs: the conversation of each row.
        need: what to score (top-k and sampled log-probs; hidden states are refused at setup).
        score_rows: the teacher's answers on its own rows (TeacherRows.batch [B, S_t]).

    Returns:
        {"topk_logprobs" [B, S, k] fp32, "topk_indices" [B, S, k] int32, "logprobs" [B, S]
        fp32: those the teacher answered, in the student's positions; XTOK_COUNTS [B, C]
        float64: the rows' counts for the metrics (TeacherRows.counts)}.
    """
    rows = rendering.teacher_rows(logs)
    scores = score_rows(rows)
    width = batch["input_ids"].shape[1]
    out, topk = {}, None
    if scores.topk_logprobs is not None:
        out["topk_logprobs"], out["topk_indices"] = rows.topk_to_student(
            scores.topk_logprobs, scores.topk_indices, width, rendering.vocab_map()
        )
        topk = (scores.topk_logprobs, out["topk_logprobs"])
    if scores.logprobs is not None:
        out["logprobs"] = rows.logprobs_to_student(scores.logprobs, width)
    out[XTOK_COUNTS] = rows.counts(batch["token_mask"], topk)
    return out
