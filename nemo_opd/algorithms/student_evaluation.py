"""The student's divergence from the teacher on validation chunks, computed while the next
chunk generates.

    evaluation = StudentEvaluation(state, background=not state.generation.colocated)
    for chunk in chunks:
        rollout = ...generate the chunk...
        batch = ...the teacher's top-k on it...       # in the caller's thread
        evaluation.submit(batch, groups)              # the student's divergence on it
    divergence, seconds = evaluation.finish()        # {validation/<metric>: mean}, seconds

With `background`, the student's evaluate() of each chunk runs in one worker thread of the
driver while the driver generates (and the teacher scores) the next: vLLM, the teacher's workers
and the student's workers are separate processes, so on a 2-core CPU (one thread each under
overlap) the student takes the core that generation leaves idle (the tiny default's
validation, measured in docs/benchmarks.md). Only where generation has devices of its
own: a colocated engine shares the GPU with the training workers and sleeps while they compute,
so there each chunk is evaluated at once, in the caller's thread. Chunks are evaluated one at
a time in the order submitted, so the sums, and the metrics, are the same either way.

The thread calls the student's workers only (with tensors; no tokenizer, no teacher): the
caller keeps the teacher and the generation engine, and the rollout producer is held while
validation runs (distillation._validate_if_due), so no other thread calls the student meanwhile.
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor

import torch

from nemo_opd.algorithms.run_state import DistillationRun
from nemo_opd.config.checks import VALIDATION_DIVERGENCE
from nemo_opd.data.batching import TensorBatch


class DivergenceSums:
    """Token-weighted sums of the validation loss's metrics, overall and per teacher."""

    NAMES = VALIDATION_DIVERGENCE  # the names checkpointing.metric_name may rank by

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, float]] = {}

    def add(self, evaluated: dict, teacher: str) -> None:
        """Add one evaluate() result; teacher "" for a run with one teacher."""
        tokens = evaluated["global_valid_toks"]
        for group in {"", teacher}:
            sums = self.sums.setdefault(group, {"tokens": 0.0})
            sums["tokens"] += tokens
            for name in self.NAMES:
                sums[name] = sums.get(name, 0.0) + evaluated[name] * tokens

    def means(self, prefix: str) -> dict:
        """{prefix + name: mean} overall, {prefix + "teacher/<t>/" + name: mean} per teacher."""
        metrics = {}
        for group, sums in self.sums.items():
            where = prefix if group == "" else f"{prefix}teacher/{group}/"
            for name in self.NAMES:
                metrics[where + name] = sums[name] / max(sums["tokens"], 1.0)
        return metrics


class StudentEvaluation:
    """The student's divergence on scored validation chunks (module docstring).

    Args:
        state: the run (its student and validation loss).
        background: evaluate in a worker thread while the caller generates the next chunk.
    """

    def __init__(self, state: DistillationRun, background: bool) -> None:
        self.state = state
        self.divergence = DivergenceSums()
        self.seconds = 0.0
        self._pool = (
            ThreadPoolExecutor(max_workers=1, thread_name_prefix="validation-student")
            if background
            else None
        )
        self._pending: list[Future] = []

    def submit(self, batch: TensorBatch, groups: dict[str, torch.Tensor | None]) -> None:
        """Evaluate the student on `batch` (a chunk's rollouts with the teacher's top-k), each
        teacher's rows apart (`groups`: {name: rows}, or {"": None} for one teacher)."""
        if self._pool is None:
            self._evaluate(batch, groups)
        else:
            self._pending.append(self._pool.submit(self._evaluate, batch, groups))

    def finish(self) -> tuple[dict, float]:
        """Wait for every chunk; ({"validation/<metric>": token-weighted mean, and per teacher
        validation/teacher/<name>/<metric>}, seconds the student's evaluation took). A chunk's
        error is raised here, after the chunks before it."""
        try:
            for pending in self._pending:
                pending.result()
        finally:
            self.close()
        return self.divergence.means("validation/"), self.seconds

    def close(self) -> None:
        """Stop the worker thread (after the chunk it is on; the rest are dropped)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
        self._pending = []

    def _evaluate(self, batch: TensorBatch, groups: dict[str, torch.Tensor | None]) -> None:
        started = time.perf_counter()
        # With several teachers, each teacher's rows apart: the overall values are the
        # token-weighted means of theirs.
        for name, rows in groups.items():
            part = batch if rows is None else TensorBatch(batch).select(rows)
            self.divergence.add(self.state.student.evaluate(part, self.state.val_loss_fn), name)
        self.seconds += time.perf_counter() - started
