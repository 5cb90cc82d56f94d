"""distillation_train's stopping rule, without workers: a run ends after max_num_steps steps or
with the last batch of its last allowed epoch, whichever comes first; that step validates
(val_at_end) and saves like the last one, and a run resumed before it ends where the
uninterrupted run does. The steps are planned by step_rollouts.plan_steps in the rollout
producer's thread, as in a real run; only producing and training a step are replaced."""

from types import SimpleNamespace

import pytest

from nemo_opd.algorithms import distillation, step_rollouts
from nemo_opd.algorithms.rollout_pipeline import ProducedStep
from nemo_opd.data.prompt_loader import PromptLoader


class Recorder:
    """What the loop did: steps trained (with their prompts), validated, saved."""

    def __init__(self):
        self.trained, self.validated, self.saved, self.logged = [], [], [], []

    def log(self, metrics, step):
        self.logged.append(step)


NO_CHECK = SimpleNamespace(generation=SimpleNamespace(logprob_check=False))
"""The policy section as the loop reads it: no refit check (nothing generates here)."""


def fake_run(records, per_step, *, max_num_steps, max_num_epochs, step=0, position=None):
    loop = SimpleNamespace(
        max_num_steps=max_num_steps,
        max_num_epochs=max_num_epochs,
        val_at_start=False,
        val_at_end=True,
        val_period=0,
        num_prompts_per_step=per_step,
        num_generations_per_prompt=2,
        max_staleness=0,
    )
    loader = PromptLoader([{"id": i} for i in range(records)], per_step, shuffle=True, seed=3)
    if position is not None:
        loader.load_state_dict(position)
    recorder = Recorder()
    checkpoints = SimpleNamespace(should_save=lambda step, is_last: is_last)
    state = SimpleNamespace(
        cfg=SimpleNamespace(distillation=loop, policy=NO_CHECK),
        loader=loader,
        step=step,
        checkpoints=checkpoints,
        logger=recorder,
        last_metrics={},
        startup={},
        started_at=0.0,
        saved_rollouts={},
        resumed_step=step,
        loader_position=None,
        generation_version=step,
    )
    return state, recorder


@pytest.fixture
def no_workers(monkeypatch):
    """The loop's steps replaced by records of their calls."""

    def install(recorder):
        def produce(state, pipeline, plan):
            return ProducedStep(plan, rollout=None, copies=2, batch={})

        def train_step(state, produced, timers):
            plan = produced.plan
            recorder.trained.append((plan.step, [s["id"] for s in plan.samples]))
            return {"train/num_tokens": 1.0}

        def validate(state, timers):
            recorder.validated.append(state.step)
            return {"validation/accuracy": 0.0}

        monkeypatch.setattr(step_rollouts, "is_on_policy_step", lambda cfg, step: True)
        monkeypatch.setattr(distillation, "produce_step", produce)
        monkeypatch.setattr(distillation, "_publish", lambda s, pipe, step: pipe.publish(step))
        monkeypatch.setattr(distillation, "_train_step", train_step)
        monkeypatch.setattr(distillation, "validate", validate)
        monkeypatch.setattr(
            distillation, "_save_checkpoint", lambda s, pipe: recorder.saved.append(s.step)
        )

    return install


def test_one_epoch_of_two_batches_is_two_steps(no_workers):
    state, recorder = fake_run(4, 2, max_num_steps=100, max_num_epochs=1)
    no_workers(recorder)
    assert distillation.distillation_train(state)
    assert [step for step, _ in recorder.trained] == [1, 2]
    assert sorted(i for _, ids in recorder.trained for i in ids) == [0, 1, 2, 3]  # each once
    assert recorder.validated == [2] and recorder.saved == [2]  # the end of the last epoch
    assert state.step == 2 and state.loader.next_epoch == 1


def test_a_run_resumed_before_the_last_step_ends_where_the_straight_run_does(no_workers):
    straight, straight_record = fake_run(6, 2, max_num_steps=100, max_num_epochs=2)
    no_workers(straight_record)
    distillation.distillation_train(straight)
    assert [step for step, _ in straight_record.trained] == [1, 2, 3, 4, 5, 6]

    # the checkpoint of step 5: the loader's position after five batches
    probe = PromptLoader([{"id": i} for i in range(6)], 2, shuffle=True, seed=3)
    batches = iter(probe)
    for _ in range(5):
        next(batches)
    resumed, resumed_record = fake_run(
        6, 2, max_num_steps=100, max_num_epochs=2, step=5, position=probe.state_dict()
    )
    no_workers(resumed_record)
    distillation.distillation_train(resumed)
    assert resumed_record.trained == straight_record.trained[5:]
    assert resumed_record.validated == straight_record.validated == [6]
    assert resumed_record.saved == straight_record.saved == [6]


def test_max_num_steps_ends_a_run_inside_an_epoch(no_workers):
    state, recorder = fake_run(10, 2, max_num_steps=3, max_num_epochs=5)
    no_workers(recorder)
    distillation.distillation_train(state)
    assert [step for step, _ in recorder.trained] == [1, 2, 3]
    assert recorder.validated == [3] and recorder.saved == [3]


def test_the_incomplete_last_batch_of_an_epoch_is_dropped(no_workers):
    state, recorder = fake_run(5, 2, max_num_steps=100, max_num_epochs=1)
    no_workers(recorder)
    distillation.distillation_train(state)
    assert [step for step, _ in recorder.trained] == [1, 2]
    assert recorder.saved == [2]
