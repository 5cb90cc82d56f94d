"""A teacher run by the run's own Ray workers: a Policy without an optimizer (DTensor or
Megatron engine), scoring on the same cluster as the student."""

from __future__ import annotations

import torch

from nemo_opd.policy.policy import Policy
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores


class InProcessTeacher:
    """The Teacher interface over a Policy's score (top-k, sampled-token log-probs and hidden
    states in one forward pass).

    Args:
        policy: the teacher's workers (started by the caller; shut down by this teacher).
        name: its part name for start-up, placement and metrics ("teacher", or
            "teacher.<name>" behind RoutedTeachers).
    """

    def __init__(self, policy: Policy, name: str = "teacher") -> None:
        self.policy = policy
        self.name = name

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        """Everything `need` asks for in one forward pass of the teacher."""
        out = self.policy.score(
            rollouts.batch,
            topk=need.topk,
            temperature=need.temperature,
            logprobs=need.sampled,
            hidden=need.hidden,
            trained_only=need.trained_only,
        )
        return TeacherScores(**out)

    def workers(self) -> dict[str, Policy]:
        return {self.name: self.policy}

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return {}

    def take_metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        self.policy.shutdown()
