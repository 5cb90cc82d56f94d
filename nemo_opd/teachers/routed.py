"""Several teachers, each scoring the rows routed to it: teachers by data source.

Each prompt's record names its teacher (data.teacher_key, through data.teacher_routes); every
rollout of the prompt carries that name in its metadata as "teacher". A batch is split by
route, each teacher scores its own rows, and the outputs go back into the batch's row order:

    teachers = RoutedTeachers({"math": math_policy, "code": code_policy})
    routes = [meta["teacher"] for meta in rollout.metadata]           # one name per row
    values, indices = teachers.get_topk_logits(batch, k, routes=routes)

Row i then holds exactly what routes[i]'s teacher computes for row i alone. The teachers score
one after another: they share the workers' devices (each takes a share of every bundle).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from nemo_opd.data.batching import TensorBatch
from nemo_opd.policy import Policy


def route_rows(routes: Sequence[str]) -> dict[str, torch.Tensor]:
    """{teacher: the indices of its rows [n] int64, ascending}, teachers in first-seen order."""
    rows: dict[str, list[int]] = {}
    for index, name in enumerate(routes):
        rows.setdefault(name, []).append(index)
    return {name: torch.tensor(indices, dtype=torch.long) for name, indices in rows.items()}


class RoutedTeachers:
    """Teachers by name behind one scoring interface; each call takes the route of every row."""

    def __init__(self, teachers: Mapping[str, Policy]):
        if not teachers:
            raise ValueError("RoutedTeachers needs at least one teacher")
        self.teachers = dict(teachers)

    def get_topk_logits(
        self, data: Mapping, k: int, temperature: float = 1.0, *, routes: Sequence[str]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's teacher's top-k log-probs [B, S, k] fp32 and ids [B, S, k] int32 (as
        Policy.get_topk_logits), for data with B rows and routes[i] the teacher of row i."""
        values, indices = self._scatter(
            data,
            routes,
            lambda teacher, rows: teacher.get_topk_logits(rows, k, temperature=temperature),
        )
        return values, indices

    def get_logprobs(
        self, data: Mapping, temperature: float = 1.0, *, routes: Sequence[str]
    ) -> torch.Tensor:
        """Each row's teacher's log-prob of every next token [B, S] fp32 (as
        Policy.get_logprobs)."""
        (logprobs,) = self._scatter(
            data,
            routes,
            lambda teacher, rows: (teacher.get_logprobs(rows, temperature=temperature),),
        )
        return logprobs

    def _scatter(
        self,
        data: Mapping,
        routes: Sequence[str],
        score: Callable[[Policy, TensorBatch], tuple[torch.Tensor, ...]],
    ) -> tuple[torch.Tensor, ...]:
        """score(teacher, its rows) for every routed teacher; each output [n, ...] is written
        into a [B, ...] tensor at its rows' indices."""
        batch = TensorBatch(data)
        if len(routes) != batch.size:
            raise ValueError(f"{len(routes)} routes for a batch of {batch.size} rows")
        unknown = sorted(set(routes) - set(self.teachers))
        if unknown:
            raise ValueError(f"rows routed to {unknown}, which are not among {sorted(self)}")
        merged: list[torch.Tensor] = []
        for name, rows in route_rows(routes).items():
            outputs = score(self.teachers[name], batch.select(rows))
            if not merged:
                merged = [out.new_zeros((batch.size, *out.shape[1:])) for out in outputs]
            for target, out in zip(merged, outputs, strict=True):
                target[rows] = out
        return tuple(merged)

    def __iter__(self):
        return iter(self.teachers)

    def items(self):
        """(name, Policy) of every teacher."""
        return self.teachers.items()

    def shutdown(self) -> None:
        for teacher in self.teachers.values():
            teacher.shutdown()
