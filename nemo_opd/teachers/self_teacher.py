"""A teacher that is the student itself: its live weights, an EMA of them, or a lagged snapshot
(teacher.source student, ema or lagged; docs/self_distillation.md).

No teacher model is loaded: the student's own workers score the rollouts, with the weights the
source names swapped in for a no-grad pass (nemo_opd.policy.engines.self_teacher_weights).
Wrapped in PrivilegedTeacher (teacher.prompt_template) this is on-policy self-distillation:
the student, shown the answer, grades the student that was not.

    teacher = PrivilegedTeacher(SelfTeacher(student), context, pad_token_id)
    scores = teacher.score(rollouts, TeacherNeed(topk=16))

The loop drives it as any teacher; the average or snapshot moves with the student's training
calls and is saved in its checkpoints, so the loop never asks which kind it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores

if TYPE_CHECKING:
    from nemo_opd.config import TeacherConfig
    from nemo_opd.policy.policy import Policy


class SelfTeacher:
    """The Teacher interface over the student's Policy.score_as_teacher.

    Args:
        student: the run's student (started, and shut down, by the run).
    """

    def __init__(self, student: Policy) -> None:
        self.student = student

    def start(self, cfg: TeacherConfig) -> None:
        """Have the student's workers hold the teacher's weights of `cfg.source` (from the
        current weights; call before a checkpoint is loaded, which restores them)."""
        self.student.hold_self_teacher(cfg.source, cfg.ema_decay, cfg.refresh_steps)

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        """Everything `need` asks for, in one no-grad forward pass of the teacher's weights."""
        out = self.student.score_as_teacher(
            rollouts.batch,
            topk=need.topk,
            temperature=need.temperature,
            logprobs=need.sampled,
            hidden=need.hidden,
            trained_only=need.trained_only,
        )
        return TeacherScores(**out)

    def workers(self) -> dict[str, Policy]:
        return {}  # the student's workers, which the run starts and reports as the policy's

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return {}

    def take_metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        """Nothing of its own to stop (the run shuts the student down)."""
