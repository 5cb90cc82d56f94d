"""The teacher interface: what the loop asks of every kind of teacher.

A teacher scores the student's rollouts. The loop hands it the rollouts (the flattened batch of
the student's token ids, and the message logs and metadata it came from) and says what it
needs; it answers in the student's positions, whatever it did to get there:

    scores = teacher.score(rollouts, TeacherNeed(topk=16, temperature=1.0))
    scores.topk_logprobs, scores.topk_indices     # [B, S, k] fp32, [B, S, k] int32
    scores = teacher.score(rollouts, TeacherNeed(sampled=True))
    scores.logprobs                               # [B, S] fp32

Position t scores the distribution of token t + 1; top-k values are log-probs over the teacher's
full vocabulary, descending; positions at or past a row's length are 0.

Besides scoring, a teacher names the Ray workers it runs (the loop waits for them at start-up,
reports their placement and start-up times; a served teacher has none), the rows each of its
named teachers scored (several teachers routed by data source; empty for one teacher), and its
metrics since it was last asked.

The kinds: InProcessTeacher (a Policy of Ray workers: DTensor or Megatron), ServedTeacher
(vLLM's OpenAI-compatible server over HTTP), RoutedTeachers (several teachers, each row scored
by its prompt's), PrivilegedTeacher (any teacher, given its own prompt). A new kind of teacher
is one more class with these methods.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.message_log import Message

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy


@dataclass(frozen=True)
class TeacherNeed:
    """What the loop needs from a teacher."""

    topk: int = 0
    """k: the top-k log-probs and ids of every position (0: none)."""
    sampled: bool = False
    """The log-prob of the token at every next position."""
    temperature: float = 1.0
    """The teacher's temperature."""
    hidden: bool = False
    """The final hidden states of every position (the full-vocabulary divergence: the
    student's engine applies the teacher's LM head)."""
    trained_only: bool = False
    """The top-k and the log-probs are read only where the next token is trained (the batch's
    token_mask at t + 1: the loss mask's positions): a teacher may leave the others 0 and skip
    their LM head (InProcessTeacher does; a served teacher computes them all)."""


@dataclass
class Rollouts:
    """The rollouts a teacher scores."""

    batch: TensorBatch
    """The student's rows: input_ids [B, S], input_lengths [B] (and the masks)."""
    message_logs: list[list[Message]]
    """The conversation of each row."""
    metadata: list[dict]
    """Each row's record fields and environment state ("teacher" names its route)."""

    def select(self, rows: torch.Tensor) -> Rollouts:
        """The rollouts of the given row indices [n], in that order."""
        picked = rows.tolist()
        return Rollouts(
            self.batch.select(rows),
            [self.message_logs[i] for i in picked],
            [self.metadata[i] for i in picked],
        )


@dataclass
class TeacherScores:
    """A teacher's answer, in the student's positions; None where not asked for."""

    topk_logprobs: torch.Tensor | None = None
    """[B, S, k] fp32."""
    topk_indices: torch.Tensor | None = None
    """[B, S, k] int32."""
    logprobs: torch.Tensor | None = None
    """[B, S] fp32."""
    hidden_states: torch.Tensor | None = None
    """[B, S, H_T] in the teacher's compute precision."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors present, by field name."""
        fields = {
            "topk_logprobs": self.topk_logprobs,
            "topk_indices": self.topk_indices,
            "logprobs": self.logprobs,
            "hidden_states": self.hidden_states,
        }
        return {name: value for name, value in fields.items() if value is not None}


class Teacher(Protocol):
    """Scores the student's rollouts (see the module docstring)."""

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        """What `need` asks for, for every row of `rollouts`, in the student's positions."""
        ...

    def workers(self) -> dict[str, Policy]:
        """{part name: Policy} of the Ray workers this teacher runs ({} for none)."""
        ...

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        """{teacher name: its rows [n] int64} with several named teachers; {} with one."""
        ...

    def take_metrics(self) -> dict[str, float]:
        """Metrics since the last call (e.g. teacher/server_retries), as logged."""
        ...

    def shutdown(self) -> None:
        """Stop what this teacher started (safe to call twice)."""
        ...


def score_with(
    teacher_topk, teacher_logprobs, rollouts: Rollouts, need: TeacherNeed, teacher_hidden=None
) -> TeacherScores:
    """TeacherScores from a teacher's get_topk_logits(batch, k, temperature=...),
    get_logprobs(batch, temperature=...) and get_hidden_states(batch) (the Policy and
    ServedTeacher calls; None: the teacher cannot send hidden states), computing only what
    need asks for."""
    scores = TeacherScores()
    if need.hidden:
        if teacher_hidden is None:
            raise ValueError(
                "this teacher cannot send its hidden states: loss_fn.support full and "
                "student_topk need a teacher run by the run's own workers"
            )
        scores.hidden_states = teacher_hidden(rollouts.batch)
    if need.topk:
        scores.topk_logprobs, scores.topk_indices = teacher_topk(
            rollouts.batch, need.topk, temperature=need.temperature
        )
    if need.sampled:
        scores.logprobs = teacher_logprobs(rollouts.batch, temperature=need.temperature)
    return scores
