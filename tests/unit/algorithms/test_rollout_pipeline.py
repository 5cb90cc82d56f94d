"""StepPipeline's schedule in real threads: each step is produced only once its weights version
is published, at most max_staleness + 1 steps ahead of training; errors reach the loop after
the steps before them; held() idles the producer; stop() never hangs. (The producer with the
real engines and teachers runs end to end in tests/functional/test_distillation_tiny.py.)"""

import threading
import time

import pytest
import torch

from nemo_opd.algorithms.rollout_pipeline import (
    PlannedStep,
    ProducedStep,
    StepPipeline,
    version_for,
)
from nemo_opd.rollouts import RolloutResult

WAIT_S = 10.0


def plans(steps: int, staleness: int, start: int = 0, fresh_every: int | None = None):
    for step in range(start + 1, steps + 1):
        yield PlannedStep(
            step=step,
            samples=[step],
            last=step == steps,
            position={"at": step - 1},
            after={"at": step},
            on_policy=True,
            version=version_for(step, staleness, fresh_every),
        )


def rollout(step: int) -> RolloutResult:
    return RolloutResult([[{"role": "assistant", "content": str(step)}]], torch.zeros(1),
                         torch.zeros(1, dtype=torch.bool), [{"step": step}])  # fmt: skip


class Recorder:
    """A produce() that notes, for each step, the newest published version when it started."""

    def __init__(self, fail_at: int | None = None, delay: float = 0.0):
        self.started: dict[int, int] = {}
        self.fail_at, self.delay = fail_at, delay
        self.published = 0
        self.busy = threading.Event()

    def __call__(self, pipeline: StepPipeline, plan: PlannedStep) -> ProducedStep:
        self.busy.set()
        self.started[plan.step] = self.published
        time.sleep(self.delay)
        if plan.step == self.fail_at:
            raise ConnectionError(f"teacher down at step {plan.step}")
        pipeline.keep(plan.step, rollout(plan.step))
        self.busy.clear()
        return ProducedStep(plan, rollout(plan.step), 1, {})


def train(pipeline: StepPipeline, recorder: Recorder, steps: int) -> list[int]:
    """The loop's side: take each step, then publish its weights."""
    taken = []
    for _ in range(steps):
        produced = pipeline.next()
        assert produced is not None
        taken.append(produced.plan.step)
        recorder.published = produced.plan.step
        pipeline.publish(produced.plan.step, f"weights {produced.plan.step}")
    assert pipeline.next() is None
    return taken


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_each_step_starts_once_its_version_is_published(staleness):
    recorder = Recorder()
    pipeline = StepPipeline(plans(8, staleness), recorder, staleness, start_version=0)
    assert train(pipeline, recorder, 8) == list(range(1, 9))
    for step, published in recorder.started.items():
        version = version_for(step, staleness)
        assert published >= version  # never sampled before its weights existed
        # and never later than needed: at most staleness + 1 steps ahead of training
        assert published <= step - 1


def test_fresh_steps_sample_from_the_newest_weights_the_others_overlap():
    """The refit check's steps (1, 1 + n, ...) under overlap: version step - 1, the rest
    max_staleness older (never older than the fresh step before them), so the producer waits
    for the step before a fresh one only."""
    assert [version_for(t, 1, 3) for t in range(1, 9)] == [0, 0, 1, 3, 3, 4, 6, 6]
    # never older than the fresh step before: weights dropped once a later version is taken
    assert [version_for(t, 2, 4) for t in range(1, 10)] == [0, 0, 0, 1, 4, 4, 4, 5, 8]
    assert [version_for(t, 0, 3) for t in range(1, 6)] == [0, 1, 2, 3, 4]  # lockstep anyway
    recorder = Recorder()
    pipeline = StepPipeline(plans(9, 1, fresh_every=4), recorder, 1, start_version=0)
    assert train(pipeline, recorder, 9) == list(range(1, 10))
    assert recorder.started[5] == 4 and recorder.started[9] == 8  # waited for the step before
    for step, published in recorder.started.items():
        assert published >= version_for(step, 1, 4)


@pytest.mark.parametrize("staleness, fresh_every", [(1, 3), (2, 4), (3, 2)])
def test_fresh_steps_hand_over_every_weights_version_they_need(staleness, fresh_every):
    """Each step refits from the version it is scheduled; the pipeline drops older versions as
    later ones are taken, which holds because versions never decrease."""
    seen = {}

    def produce(pipeline, plan):
        if plan.version:
            seen[plan.step] = pipeline.weights(plan.version)
        return ProducedStep(plan, rollout(plan.step), 1, {})

    steps = 10
    pipeline = StepPipeline(plans(steps, staleness, fresh_every=fresh_every), produce,
                            staleness, start_version=0)  # fmt: skip
    for step in range(1, steps + 1):
        assert pipeline.next().plan.step == step
        pipeline.publish(step, f"weights {step}")
    expected = {t: version_for(t, staleness, fresh_every) for t in range(1, steps + 1)}
    assert seen == {t: f"weights {v}" for t, v in expected.items() if v}


def test_a_save_after_publishing_waits_for_a_fresh_step_without_deadlock():
    """The loop publishes step t's weights before a save holds the producer through t + s:
    a fresh step t + 1 (sampled from those weights) is then produced, not waited for forever."""
    recorder = Recorder()
    pipeline = StepPipeline(plans(6, 1, fresh_every=3), recorder, 1, start_version=0)
    for step in (1, 2, 3):
        assert pipeline.next().plan.step == step
        recorder.published = step
        pipeline.publish(step, f"weights {step}")
    with pipeline.held(through=3 + 1):  # step 4 is fresh: version 3, just published
        assert sorted(pipeline.rollouts_after(3)) == [4]
    pipeline.stop()


def test_lockstep_produces_a_step_only_after_the_previous_one_trained():
    recorder = Recorder()
    pipeline = StepPipeline(plans(5, 0), recorder, 0, start_version=0)
    train(pipeline, recorder, 5)
    assert recorder.started == {step: step - 1 for step in range(1, 6)}


def test_staleness_one_samples_step_two_from_the_initial_weights_ahead_of_training():
    recorder = Recorder()
    pipeline = StepPipeline(plans(4, 1), recorder, 1, start_version=0)
    first = pipeline.next()
    deadline = time.monotonic() + WAIT_S
    while 2 not in recorder.started and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.plan.step == 1 and recorder.started[2] == 0  # before step 1 was published
    assert 3 not in recorder.started  # step 3 needs the weights after step 1
    pipeline.publish(1, "weights 1")
    assert pipeline.next().plan.step == 2
    pipeline.stop()


def test_weights_are_handed_over_and_older_ones_dropped():
    seen = []

    def produce(pipeline, plan):
        if plan.version:
            seen.append(pipeline.weights(plan.version))
        return ProducedStep(plan, rollout(plan.step), 1, {})

    pipeline = StepPipeline(plans(4, 1), produce, 1, start_version=0)
    for step in range(1, 5):
        assert pipeline.next().plan.step == step
        pipeline.publish(step, f"weights {step}")
    assert seen == ["weights 1", "weights 2"]  # steps 3 and 4
    assert not pipeline.has_weights(1)


def test_an_error_reaches_the_loop_after_the_steps_before_it():
    recorder = Recorder(fail_at=3)
    pipeline = StepPipeline(plans(6, 1), recorder, 1, start_version=0)
    assert pipeline.next().plan.step == 1
    pipeline.publish(1, "w1")
    assert pipeline.next().plan.step == 2
    with pytest.raises(ConnectionError, match="teacher down at step 3"):
        pipeline.next()
    assert pipeline.failed_plan.step == 3 and pipeline.failed_plan.position == {"at": 2}
    pipeline.stop()


def test_held_waits_for_the_steps_ahead_and_keeps_the_producer_idle():
    recorder = Recorder(delay=0.05)
    pipeline = StepPipeline(plans(6, 2), recorder, 2, start_version=0)
    assert pipeline.next().plan.step == 1
    pipeline.publish(1, "w1")
    with pipeline.held(through=3):
        # steps 2 and 3 (from the initial weights) exist, and nothing runs meanwhile
        assert sorted(pipeline.rollouts_after(1)) == [2, 3]
        assert not recorder.busy.is_set()
        count = len(recorder.started)
        time.sleep(0.2)
        assert len(recorder.started) == count
    assert [pipeline.next().plan.step for _ in range(2)] == [2, 3]
    pipeline.stop()


def test_a_resumed_pipeline_starts_at_its_step_with_its_weights():
    seen = []

    def produce(pipeline, plan):
        seen.append((plan.step, pipeline.weights(plan.version)))
        return ProducedStep(plan, rollout(plan.step), 1, {})

    resumed = plans(6, 0, start=4)
    pipeline = StepPipeline(resumed, produce, 0, start_version=4, start_weights="weights 4")
    assert pipeline.next().plan.step == 5
    assert seen == [(5, "weights 4")]
    pipeline.stop()


def test_stop_returns_while_the_producer_waits_for_weights():
    recorder = Recorder()
    pipeline = StepPipeline(plans(5, 0), recorder, 0, start_version=0)
    pipeline.next()
    started = time.monotonic()
    pipeline.stop()
    assert time.monotonic() - started < 5.0
    assert recorder.started == {1: 0}
