"""Rollouts ahead of training: one producer thread of the driver makes the steps' scored
rollouts in order while the loop trains (distillation.max_staleness).

    pipeline = StepPipeline(plans, produce, max_staleness, start_version=state.step)
    produced = pipeline.next()                 # step t's scored rollouts (None: no more steps)
    ... train step t ...
    pipeline.publish(t, weights_ref)           # the weights after step t exist
    with pipeline.held(through=t + s): ...     # save: rollouts of t+1..t+s complete, producer idle

The schedule is exact: step t's rollouts are sampled from the weights after step
version_for(t) = max(0, t - 1 - max_staleness) (or t - 1 on the steps the refit check samples
fresh), so a run samples alike whatever the timing, and a resumed run like an uninterrupted one.
The producer makes step t once that version is published; with max_staleness 0 it therefore
waits for every step to finish (lockstep), with s > 0 it is at most s + 1 steps ahead.
Everything the producer does goes through `produce` (refit, generation, grading, teacher
scoring); this module only schedules.

The driver holds only the steps in flight: a step's rollouts are kept (for a checkpoint that
saves the rollouts made ahead of it) from keep() until next() hands the step to the loop, and
neither the producer nor the pipeline refers to a step after that; the loop lets go of it once
trained. So at most max_staleness + 1 steps' rollouts exist at once, however long the run.

The producer thread talks to other processes only through Ray calls and HTTP requests, each
with the time-outs of those layers; the driver's waits on it poll its liveness, so a producer
that dies never leaves the loop waiting. An error of the producer ends production and is raised
by next() in the loop's thread, for the step it hit (failed_plan), after every step before it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from nemo_opd.data.batching import TensorBatch
from nemo_opd.rollouts import RolloutResult

POLL_S = 0.5
"""How often a wait on the producer checks that its thread is still alive."""
JOIN_TIMEOUT_S = 10.0
"""How long stop() waits for the producer's current call to return (a run that ends on an
error then shuts its workers down, which ends any call still in flight)."""


@dataclass
class PlannedStep:
    """A step as the loop plans it, before any rollout exists."""

    step: int
    samples: list
    """The step's prompts (PromptLoader samples)."""
    last: bool
    """The run's last step (max_num_steps, or the last batch of the last epoch)."""
    position: dict
    """The loader's state before this step's prompts."""
    after: dict
    """The loader's state after them (what a checkpoint of this step records)."""
    on_policy: bool
    """The student samples this step (else the dataset's or the teacher's responses)."""
    version: int | None
    """The weights (after this many steps) that sample it; None off-policy."""


@dataclass
class ProducedStep:
    """A planned step with its scored rollouts."""

    plan: PlannedStep
    rollout: RolloutResult
    copies: int
    """Conversations per prompt."""
    batch: TensorBatch
    """Flattened rollouts with the teacher's scores."""
    seconds: dict[str, float] = field(default_factory=dict)
    """Seconds per phase of the producer ("refit", "generation", "teacher_topk", ...)."""
    metrics: dict[str, float] = field(default_factory=dict)
    """The teacher's metrics since the previous step (teacher/*)."""


def version_for(step: int, max_staleness: int, fresh_every: int | None = None) -> int:
    """The weights version that samples step `step` (1-based): max(0, step - 1 - s). With
    fresh_every, steps 1, 1 + fresh_every, 1 + 2 x fresh_every, ... sample from the newest
    weights, step - 1 (the refit check's steps under overlap), and no step after one of them
    samples from weights older than it did (versions never decrease from step to step)."""
    version = max(0, step - 1 - max_staleness)
    if fresh_every:
        fresh = step - (step - 1) % fresh_every  # the last fresh step up to this one
        version = max(version, fresh - 1)
    return version


class StepPipeline:
    """Produces ProducedSteps in a thread, each once its weights version is published.

    Args:
        plans: the steps in order (the producer draws them; nothing else may).
        produce: produce(pipeline, plan) makes a ProducedStep of a PlannedStep (in the producer
            thread); it may call pipeline.weights(version) and pipeline.keep(step, rollout).
        max_staleness: see version_for.
        start_version: the weights version that exists now (the resumed step, or 0).
        start_weights: what produce() refits from to sample from start_version (None: the
            engine holds it already).
    """

    def __init__(
        self,
        plans: Iterator[PlannedStep],
        produce: Callable[[StepPipeline, PlannedStep], ProducedStep],
        max_staleness: int,
        start_version: int,
        start_weights: Any = None,
    ) -> None:
        self.max_staleness = max_staleness
        self._plans = plans
        self._produce = produce
        self._cond = threading.Condition()
        self._published = start_version
        self._weights: dict[int, Any] = {}
        if start_weights is not None:
            self._weights[start_version] = start_weights
        self._ready: deque[ProducedStep] = deque()
        self._rollouts: dict[int, RolloutResult] = {}
        self._produced_through = start_version
        self._paused = False
        self._busy = False
        self._done = False
        self._stopped = False
        self._error: BaseException | None = None
        self.failed_plan: PlannedStep | None = None
        self._thread = threading.Thread(target=self._run, name="rollout-producer", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ the loop's side

    def next(self) -> ProducedStep | None:
        """The next step's scored rollouts, waiting for them; None after the last step. An
        error of the producer is raised here once the steps before it are taken (failed_plan
        is then the step it hit)."""
        with self._cond:
            self._wait(lambda: self._ready or self._done)
            if self._ready:
                produced = self._ready.popleft()
                self._forget_through(produced.plan.step)
                return produced
            if self._error is not None:
                raise self._error
            return None

    def publish(self, version: int, weights: Any = None) -> None:
        """The weights after `version` steps exist; `weights` is what produce() refits from
        (None: no step samples from them). Older weights no step still needs are dropped."""
        with self._cond:
            self._published = version
            if weights is not None:
                self._weights[version] = weights
            self._cond.notify_all()

    def weights(self, version: int) -> Any:
        """The published weights of `version` (for produce)."""
        with self._cond:
            for old in [v for v in self._weights if v < version]:
                del self._weights[old]
            return self._weights[version]

    def has_weights(self, version: int) -> bool:
        with self._cond:
            return version in self._weights

    def keep(self, step: int, rollout: RolloutResult) -> None:
        """Record step's rollouts as soon as they exist (before scoring), for checkpoints; they
        are forgotten when next() hands the step to the loop (its checkpoints need only later
        steps' rollouts), so the pipeline holds at most the steps in flight."""
        with self._cond:
            self._rollouts[step] = rollout

    def rollouts_after(self, step: int) -> dict[int, RolloutResult]:
        """The rollouts of steps step+1..step+max_staleness that exist (for a checkpoint of
        `step`)."""
        with self._cond:
            last = step + self.max_staleness
            return {s: r for s, r in sorted(self._rollouts.items()) if step < s <= last}

    @contextmanager
    def held(self, through: int = 0) -> Iterator[None]:
        """The producer idle for the block (it may use the generation engine and the teacher
        meanwhile), after it has produced every step up to `through` (or failed, or ended)."""
        with self._cond:
            self._wait(lambda: self._produced_through >= through or self._done)
            self._paused = True
            self._wait(lambda: not self._busy)
        try:
            yield
        finally:
            with self._cond:
                self._paused = False
                self._cond.notify_all()

    def stop(self) -> None:
        """End production (after the producer's current call returns, up to JOIN_TIMEOUT_S; a
        call into a worker that is being shut down returns with an error, which is dropped)."""
        with self._cond:
            self._stopped = True
            self._paused = False
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(JOIN_TIMEOUT_S)

    # ------------------------------------------------------------------ the producer

    def _run(self) -> None:
        try:
            for plan in self._plans:
                if not self._start(plan):
                    return
                self._produce_step(plan)
        except BaseException as error:  # raised in the loop's thread by next()
            with self._cond:
                self._error = error
        finally:
            with self._cond:
                self._busy = False
                self._done = True
                self._cond.notify_all()

    def _produce_step(self, plan: PlannedStep) -> None:
        """Produce plan's step for the loop. The producer keeps no reference to it once it is
        handed over (a local of the producer's loop would hold it until the next step)."""
        try:
            produced = self._produce(self, plan)
        except BaseException:
            self.failed_plan = plan
            raise
        with self._cond:
            self._busy = False
            self._ready.append(produced)
            self._produced_through = plan.step
            self._cond.notify_all()

    def _start(self, plan: PlannedStep) -> bool:
        """Wait until plan's weights exist and the producer is not held; False when stopped."""
        needed = plan.version if plan.version is not None else 0
        with self._cond:
            while not self._stopped and (self._paused or self._published < needed):
                self._cond.wait(POLL_S)
            self._busy = not self._stopped
            return not self._stopped

    def _forget_through(self, step: int) -> None:
        """Drop the kept rollouts of steps up to `step` (holding the condition)."""
        for old in [s for s in self._rollouts if s <= step]:
            del self._rollouts[old]

    def _wait(self, ready: Callable[[], Any]) -> None:
        """Wait (holding the condition) until ready(); RuntimeError if the producer thread
        ended without saying so (it always does; this guards the loop against a hang)."""
        while not ready():
            if not self._thread.is_alive() and not ready():
                raise RuntimeError("the rollout producer thread ended unexpectedly")
            self._cond.wait(POLL_S)
