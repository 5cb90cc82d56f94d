"""The teacher interface: what the loop asks of every kind of teacher.

A teacher scores the student's rollouts. The loop hands it the rollouts (the flattened batch of
the student's token ids, and the message logs and metadata it came from) and says what it
needs; it answers in the student's positions, whatever it did to get there (Rollouts,
TeacherNeed and TeacherScores: nemo_opd.scoring.base):

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
by its prompt's), PrivilegedTeacher (any teacher, given its own prompt), SelfTeacher (the
student's own workers: teacher.source student, ema or lagged). A new kind of teacher is one
more class with these methods.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy


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
