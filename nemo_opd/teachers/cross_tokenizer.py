"""CrossTokenizerTeacher: a teacher with another tokenizer (and chat template), answering in
the student's positions and vocabulary.

It renders the student's rollouts in the teacher's tokens and maps the teacher's answers back
(nemo_opd.scoring.rendering: TeacherRendering, score_rendered): in the teacher's own workers
(Policy.score_rendered), in a pool of render workers that also send a served teacher's
requests (nemo_opd.scoring.render_pool), or on the driver's thread. It keeps the metrics of the
rows it scored (teacher/xtok_*), and when more than teacher.max_unrendered_share of the rows
scored for a step are unrendered, the run stops with a RunError (`take_metrics`): a teacher
that cannot read the run's conversations would leave an empty loss.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from nemo_opd.errors import RunError
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.scoring.render_pool import RenderPool
from nemo_opd.scoring.rendering import (
    XTOK_COUNTS,
    TeacherRendering,
    rendered_fields,
    score_rendered,
)
from nemo_opd.scoring.xtok_rows import COUNTS
from nemo_opd.teachers.base import Teacher

if TYPE_CHECKING:
    from nemo_opd.policy.policy import Policy


class CrossTokenizerTeacher:
    """Any teacher, reading the student's rollouts in its own tokens and answering in the
    student's positions and vocabulary (the Teacher interface).

    Args:
        inner: the teacher, scoring rows in its own tokens.
        rendering: how it reads the student's conversations.
        workers: the inner teacher's own workers, when it runs them (an in-process teacher):
            each data-parallel replica then renders, scores and maps its own rows
            (Policy.score_rendered), and the driver only ships conversations and collects
            answers. None: the pool renders and maps, or else the driver's thread.
        max_unrendered_share: the largest share of the rows scored for a step that may be
            unrendered (teacher.max_unrendered_share); more ends the run (take_metrics).
        name: the teacher's config section, named in that error.
        pool: render workers, each with a teacher of its own (a served teacher's client),
            that render, score and map the rows off the driver's thread; its teachers'
            metrics are reported with the inner teacher's, and shutdown() closes it.
    """

    def __init__(
        self,
        inner: Teacher,
        rendering: TeacherRendering,
        workers: Policy | None = None,
        max_unrendered_share: float = 1.0,
        name: str = "teacher",
        pool: RenderPool | None = None,
    ) -> None:
        self.inner = inner
        self.pool = pool
        self.max_unrendered_share = max_unrendered_share
        self.name = name
        self.rendering = rendering
        self.vocab = rendering.vocab_map()
        self._workers = workers
        self._workers_render = False  # the rendering is sent to the workers at first use
        self._mapped: list[float] = []
        self._graded: list[float] = []
        self._chained: list[float] = []
        self._unrendered = 0
        self._truncated = 0
        self._rows = 0

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        # The teacher's rows are its own rendering: every position of them is scored, and the
        # alignment picks what lands on the student's trained positions.
        need = replace(need, trained_only=False)
        if self.pool is not None:
            answer = self.pool.score(rollouts.batch, rollouts.message_logs, need)
        elif self._workers is None:
            answer = score_rendered(
                self.rendering,
                rollouts.batch,
                rollouts.message_logs,
                need,
                lambda rows: self.inner.score(
                    Rollouts(rows.batch, rows.logs, rollouts.metadata), need
                ),
            )
        else:
            answer = self._score_in_workers(rollouts, need)
        self._note(answer.pop(XTOK_COUNTS), topk="topk_logprobs" in answer)
        return TeacherScores(**answer)

    def _score_in_workers(self, rollouts: Rollouts, need: TeacherNeed) -> dict:
        if not self._workers_render:
            self._workers.set_rendering(self.rendering)
            self._workers_render = True
        return self._workers.score_rendered(
            rollouts.batch,
            [[rendered_fields(m) for m in log] for log in rollouts.message_logs],
            topk=need.topk,
            temperature=need.temperature,
            logprobs=need.sampled,
        )

    def _note(self, counts: torch.Tensor, topk: bool) -> None:
        """The metrics of one scored batch from its rows' counts [B, len(COUNTS)]: the graded
        and chained shares and the mapped mass (with a top-k) as this batch's ratios, the
        unrendered and truncated rows summed."""
        total = dict(zip(COUNTS, counts.sum(0).tolist(), strict=True))
        self._rows += counts.shape[0]
        self._unrendered += int(total["unrendered"])
        self._truncated += int(total["truncated"])
        if not topk:
            return
        self._graded.append(total["graded"] / max(1.0, total["predicting"]))
        self._chained.append(total["chained"] / max(1.0, total["graded"]))
        if total["mapped"] > 0:
            self._mapped.append(total["mapped_mass"] / total["mapped"])

    def workers(self) -> dict[str, Policy]:
        return self.inner.workers()

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return self.inner.groups(metadata)

    def take_metrics(self) -> dict[str, float]:
        """The metrics of the rows scored since the last call (a step's); RunError when more
        than max_unrendered_share of those rows could not be rendered."""
        self._check_unrendered()
        metrics = self.inner.take_metrics()
        for key, value in (self.pool.take_metrics() if self.pool is not None else {}).items():
            metrics[key] = metrics.get(key, 0.0) + value
        if self._mapped:
            metrics["teacher/xtok_mapped_mass"] = sum(self._mapped) / len(self._mapped)
            self._mapped = []
        if self._graded:
            metrics["teacher/xtok_graded_share"] = sum(self._graded) / len(self._graded)
            self._graded = []
        if self._chained:
            metrics["teacher/xtok_chained_share"] = sum(self._chained) / len(self._chained)
            self._chained = []
        metrics["teacher/xtok_unrendered_rows"] = float(self._unrendered)
        metrics["teacher/xtok_truncated_rows"] = float(self._truncated)
        self._unrendered = self._truncated = self._rows = 0
        return metrics

    def _check_unrendered(self) -> None:
        unrendered, rows = self._unrendered, self._rows
        name, share = self.name, self.max_unrendered_share
        if rows == 0 or unrendered <= share * rows:
            return
        raise RunError(
            f"{name}: its chat template could not render {unrendered} of the {rows} "
            f"conversations of this step ({unrendered / rows:.0%}, more than "
            f"{name}.max_unrendered_share {share:g}), which are not graded; set "
            f"{name}.tokenizer.chat_template to one that renders the run's conversations, or "
            f"raise {name}.max_unrendered_share (docs/cross_tokenizer.md); the checkpoints "
            "saved so far are intact"
        )

    def shutdown(self) -> None:
        if self.pool is not None:
            self.pool.close()
        self.inner.shutdown()
