"""Several teachers, each scoring the rows routed to it: teachers by data source.

Each prompt's record names its teacher (data.teacher_key, through data.teacher_routes); every
rollout of the prompt carries that name in its metadata as "teacher". A batch is split by
route, each teacher scores its own rows, and the outputs go back into the batch's row order:

    teachers = RoutedTeachers({"math": math_teacher, "code": code_teacher})
    scores = teachers.score(rollouts, TeacherNeed(topk=k))   # routes from rollouts.metadata

Row i then holds exactly what its teacher computes for row i alone. The teachers score one
after another: they share the workers' devices (each takes a share of every bundle).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import torch

from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.teachers.base import Teacher

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy

ROUTE_KEY = "teacher"
"""The metadata field that names a row's teacher."""


def route_rows(routes: Sequence[str]) -> dict[str, torch.Tensor]:
    """{teacher: the indices of its rows [n] int64, ascending}, teachers in first-seen order."""
    rows: dict[str, list[int]] = {}
    for index, name in enumerate(routes):
        rows.setdefault(name, []).append(index)
    return {name: torch.tensor(indices, dtype=torch.long) for name, indices in rows.items()}


class RoutedTeachers:
    """Teachers by name behind the Teacher interface; each row's metadata names its teacher."""

    def __init__(self, teachers: Mapping[str, Teacher]):
        if not teachers:
            raise ValueError("RoutedTeachers needs at least one teacher")
        self.teachers = dict(teachers)

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        """Each row's teacher's scores (its rows alone), written back in the batch's order."""
        merged: dict[str, torch.Tensor] = {}
        size = rollouts.batch.size
        for name, rows in self.groups(rollouts.metadata).items():
            scores = self.teachers[name].score(rollouts.select(rows), need)
            for field, values in scores.tensors().items():
                if field not in merged:
                    merged[field] = values.new_zeros((size, *values.shape[1:]))
                merged[field][rows] = values
        return TeacherScores(**merged)

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        """{teacher: its rows}; ValueError for a row without a route or routed to no teacher."""
        routes = [meta.get(ROUTE_KEY) for meta in metadata]
        unknown = sorted({str(route) for route in routes} - set(self.teachers))
        if unknown:
            raise ValueError(f"rows routed to {unknown}, which are not among {sorted(self)}")
        return route_rows(routes)

    def workers(self) -> dict[str, Policy]:
        return {
            part: p for teacher in self.teachers.values() for part, p in teacher.workers().items()
        }

    def take_metrics(self) -> dict[str, float]:
        return {
            k: v for teacher in self.teachers.values() for k, v in teacher.take_metrics().items()
        }

    def __iter__(self):
        return iter(self.teachers)

    def shutdown(self) -> None:
        for teacher in self.teachers.values():
            teacher.shutdown()
