"""The driver's memory over a long run: distillation_train with the real rollout pipeline and
the real checkpoint step (which saves the rollouts made ahead), workers replaced by records.
Every step's rollouts are as large as a real step's message logs (Python lists of token ids
and log-probs); the driver must hold only the steps in flight, never the run's history."""

import tracemalloc
import weakref
from types import SimpleNamespace

import pytest
import torch

from nemo_opd.algorithms import distillation, step_rollouts
from nemo_opd.algorithms.resume import ROLLOUTS_AHEAD_KEY
from nemo_opd.algorithms.rollout_pipeline import ProducedStep
from nemo_opd.data.prompt_loader import PromptLoader
from nemo_opd.rollouts import RolloutResult

STEPS = 120
TOKENS = 4000
"""Generated tokens per step (one rollout of TOKENS tokens: ~300 kB of Python objects)."""
SAVE_PERIOD = 10

NO_CHECK = SimpleNamespace(generation=SimpleNamespace(logprob_check=False))
"""The policy section as the loop reads it: no refit check (nothing generates here)."""


def step_rollouts_of(step: int) -> RolloutResult:
    """One rollout of TOKENS distinct token ids and log-probs (as a real step's are)."""
    first = step * TOKENS + 1000  # past the small ints Python shares
    message = {
        "role": "assistant",
        "content": "",
        "token_ids": list(range(first, first + TOKENS)),
        "generation_logprobs": [-1.0 / (first + i) for i in range(TOKENS)],
    }
    return RolloutResult([[message]], torch.zeros(1), torch.zeros(1, dtype=torch.bool), [{}])


class Checkpoints:
    """A checkpoint manager that records, per saved step, the steps of the rollouts saved
    ahead of it."""

    def __init__(self):
        self.ahead: dict[int, list[int]] = {}

    def should_save(self, step, is_last):
        return is_last or step % SAVE_PERIOD == 0

    def save(self, step, write, *, state, metrics):
        self.ahead[step] = list(state[ROLLOUTS_AHEAD_KEY])

    def checkpoints(self):
        return sorted(self.ahead)


class Run:
    """The replaced producer and trainer: each step's rollouts (watched by weak references),
    and, when the producer starts a step, which earlier steps' rollouts are still alive."""

    def __init__(self):
        self.rollouts: dict[int, weakref.ref] = {}
        self.alive_before: dict[int, list[int]] = {}
        self.traced: dict[int, int] = {}

    def produce(self, state, pipeline, plan):
        self.alive_before[plan.step] = [s for s, ref in self.rollouts.items() if ref()]
        rollout = step_rollouts_of(plan.step)
        self.rollouts[plan.step] = weakref.ref(rollout)
        pipeline.keep(plan.step, rollout)
        return ProducedStep(plan, rollout, copies=1, batch={})

    def train_step(self, state, produced, timers):
        self.traced[produced.plan.step] = tracemalloc.get_traced_memory()[0]
        return {"train/num_tokens": float(TOKENS)}


def fake_state(staleness: int) -> SimpleNamespace:
    loop = SimpleNamespace(
        max_num_steps=STEPS,
        max_num_epochs=1,
        val_at_start=False,
        val_at_end=False,
        val_period=0,
        num_prompts_per_step=1,
        num_generations_per_prompt=1,
        max_staleness=staleness,
    )
    loader = PromptLoader([{"id": i} for i in range(STEPS)], 1, shuffle=False, seed=0)
    logger = SimpleNamespace(log=lambda metrics, step: None)
    return SimpleNamespace(
        cfg=SimpleNamespace(distillation=loop, policy=NO_CHECK),
        loader=loader,
        step=0,
        checkpoints=Checkpoints(),
        logger=logger,
        last_metrics={},
        startup={},
        started_at=0.0,
        saved_rollouts={},
        resumed_step=0,
        loader_position=None,
        generation_version=0,
    )


@pytest.fixture
def traced():
    tracemalloc.start()
    yield
    tracemalloc.stop()


@pytest.mark.parametrize("staleness", [0, 2])
def test_a_long_run_holds_only_the_steps_in_flight(monkeypatch, traced, staleness):
    run, state = Run(), fake_state(staleness)
    monkeypatch.setattr(step_rollouts, "is_on_policy_step", lambda cfg, step: True)
    monkeypatch.setattr(distillation, "produce_step", run.produce)
    monkeypatch.setattr(distillation, "_train_step", run.train_step)
    monkeypatch.setattr(distillation, "_publish", lambda s, pipe, step: pipe.publish(step))
    assert distillation.distillation_train(state)

    # When the producer starts step t, the rollouts of steps t-s..t-1 may still be in flight
    # (made ahead, or training); nothing older is alive, in the pipeline or in the loop.
    for step, alive in run.alive_before.items():
        assert all(step - staleness <= s < step for s in alive), (step, alive)
    # The driver's traced memory is flat: the last step holds what an early one did, give or
    # take the steps in flight (keeping the history would add a step's rollouts per step).
    grown = run.traced[STEPS] - run.traced[SAVE_PERIOD]
    assert grown < (staleness + 2) * rollout_bytes(), grown / rollout_bytes()
    # Checkpoints still save the rollouts made ahead of them.
    for step, ahead in state.checkpoints.ahead.items():
        assert ahead == list(range(step + 1, min(step + staleness, STEPS) + 1))


def rollout_bytes() -> int:
    """Traced bytes of one step's rollouts."""
    before = tracemalloc.get_traced_memory()[0]
    rollout = step_rollouts_of(1)
    size = tracemalloc.get_traced_memory()[0] - before
    del rollout
    return size
