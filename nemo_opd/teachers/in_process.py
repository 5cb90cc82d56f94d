"""A teacher run by the run's own Ray workers: a Policy without an optimizer (DTensor or
Megatron engine), scoring on the same cluster as the student."""

from __future__ import annotations

import torch

from nemo_opd.policy.policy import Policy
from nemo_opd.teachers.base import Rollouts, TeacherNeed, TeacherScores, score_with


class InProcessTeacher:
    """The Teacher interface over a Policy's get_topk_logits / get_logprobs.

    Args:
        policy: the teacher's workers (started by the caller; shut down by this teacher).
        name: its part name for start-up, placement and metrics ("teacher", or
            "teacher.<name>" behind RoutedTeachers).
    """

    def __init__(self, policy: Policy, name: str = "teacher") -> None:
        self.policy = policy
        self.name = name

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        policy = self.policy
        return score_with(
            policy.get_topk_logits, policy.get_logprobs, rollouts, need, policy.get_hidden_states
        )

    def workers(self) -> dict[str, Policy]:
        return {self.name: self.policy}

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return {}

    def take_metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        self.policy.shutdown()
