"""A teacher that sees more than the student: privileged context.

The teacher scores the student's conversation after its own opening, built from the record
(`teacher.prompt_template`, say "{prompt}\n\nA correct solution: {response}"), while the
student sees the plain prompt. With the student's own starting checkpoint as the teacher, this
is on-policy self-distillation: the model with the answer in view grades the model without it.

    context = PrivilegedContext(formatter, "{prompt}\\n\\nA correct solution: {response}")
    rows = context.teacher_rows(rollout.message_logs, rollout.metadata, pad_token_id)
    values, indices = teacher.get_topk_logits(rows.batch, k)      # the teacher's positions
    values = rows.to_student(values, width)                       # the student's positions

PrivilegedTeacher does this around any teacher, behind the Teacher interface.

The opening of a conversation is every message before its first assistant message (system and
user prompt, ending with the assistant header); everything after it (the assistant turns and
any environment replies, multi-turn included) keeps its exact token ids. A row whose student
opening has p tokens and whose teacher opening has q scores, at the teacher's position t + q - p,
what the student's position t scores: the same next token after the same response prefix. The
student's positions before p - 1 (inside its prompt, never trained) are 0, as past a row's end.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from nemo_opd.config.templates import PRIVILEGED_FIELDS as FIELDS
from nemo_opd.config.templates import template_problem
from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import Message, flatten_message_logs, log_length
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.teachers.base import Teacher

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy


@dataclass
class TeacherRows:
    """The teacher's rows of a batch, and how they line up with the student's."""

    batch: TensorBatch
    """input_ids [B, S_t], input_lengths [B] (token_mask, sample_mask as flattened)."""
    logs: list[list[Message]]
    """The teacher's conversations (its opening, then the student's turns)."""
    student_opening: torch.Tensor
    """[B] int64: tokens of each student row's opening (p)."""
    teacher_opening: torch.Tensor
    """[B] int64: tokens of each teacher row's opening (q)."""
    student_lengths: torch.Tensor
    """[B] int64: each student row's length."""

    def to_student(self, values: torch.Tensor, width: int) -> torch.Tensor:
        """[B, S_t, ...] teacher outputs -> [B, width, ...] in the student's positions: position
        t in [p - 1, length) takes the teacher's t + q - p; the others are 0."""
        out = values.new_zeros((values.shape[0], width, *values.shape[2:]))
        for row in range(values.shape[0]):
            start = int(self.student_opening[row]) - 1
            end = int(self.student_lengths[row])
            shift = int(self.teacher_opening[row]) - int(self.student_opening[row])
            out[row, start:end] = values[row, start + shift : end + shift]
        return out


class PrivilegedContext:
    """Builds the teacher's rows from a template over the record's fields.

    Args:
        formatter: renders and tokenizes the teacher's opening (the run's formatter: the same
            chat template and system prompt; the template replaces the user message whole).
        template: a Python format string over FIELDS.
    """

    def __init__(self, formatter: ChatFormatter, template: str) -> None:
        problem = template_problem(template, FIELDS)
        if problem:
            raise ValueError(f"the privileged template {problem}")
        self.formatter = ChatFormatter(
            formatter.tokenizer, None, formatter.system_prompt, formatter.template_kwargs
        )
        self.template = template

    def openings(self, metadata: list[dict]) -> list[list[Message]]:
        """The teacher's opening of each record: its template rendered and tokenized."""
        return self.formatter.prompt_logs([self.template.format(**_fields(m)) for m in metadata])

    def longest_growth(self, samples: list[dict]) -> tuple[int, int]:
        """(the most tokens the teacher's opening adds to the student's, at which sample) over
        prompt samples ({"message_log": the student's prompt log, "metadata": the record's
        fields}, as PromptSet holds them): a teacher row is at most that much longer than its
        student row."""
        openings = self.openings([sample["metadata"] for sample in samples])
        growth = [
            log_length(opening) - log_length(log[: _opening_size(log)])
            for opening, log in zip(openings, (s["message_log"] for s in samples), strict=True)
        ]
        index = max(range(len(growth)), key=growth.__getitem__)
        return growth[index], index

    def teacher_rows(
        self, logs: list[list[Message]], metadata: list[dict], pad_token_id: int
    ) -> TeacherRows:
        """The teacher's rows: each conversation with the teacher's opening in place of the
        student's. metadata[i] holds the fields the template names."""
        openings = self.openings(metadata)
        cut = [_opening_size(log) for log in logs]
        teacher_logs = [
            opening + log[size:] for opening, log, size in zip(openings, logs, cut, strict=True)
        ]
        return TeacherRows(
            batch=flatten_message_logs(teacher_logs, pad_token_id),
            logs=teacher_logs,
            student_opening=torch.tensor(
                [log_length(log[:n]) for log, n in zip(logs, cut, strict=True)]
            ),
            teacher_opening=torch.tensor([log_length(opening) for opening in openings]),
            student_lengths=torch.tensor([log_length(log) for log in logs]),
        )


class PrivilegedTeacher:
    """Any teacher, given its own prompt: it scores the teacher's rows (PrivilegedContext) and
    answers in the student's positions (the Teacher interface)."""

    def __init__(self, inner: Teacher, context: PrivilegedContext, pad_token_id: int) -> None:
        self.inner = inner
        self.context = context
        self.pad_token_id = pad_token_id

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        rows = self.context.teacher_rows(
            rollouts.message_logs, rollouts.metadata, self.pad_token_id
        )
        scores = self.inner.score(Rollouts(rows.batch, rows.logs, rollouts.metadata), need)
        width = rollouts.batch["input_ids"].shape[1]
        moved = {name: rows.to_student(v, width) for name, v in scores.tensors().items()}
        return TeacherScores(**moved)

    def workers(self) -> dict[str, Policy]:
        return self.inner.workers()

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return self.inner.groups(metadata)

    def take_metrics(self) -> dict[str, float]:
        return self.inner.take_metrics()

    def shutdown(self) -> None:
        self.inner.shutdown()


def _opening_size(log: list[Message]) -> int:
    """Messages before the first assistant message."""
    return next((i for i, m in enumerate(log) if m["role"] == "assistant"), len(log))


def _fields(meta: dict) -> dict:
    return {name: meta[name] for name in FIELDS if name in meta}
