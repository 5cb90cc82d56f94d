"""MathEnvironment on a local Ray session: rewards, done flags, retry messages, order, timeouts."""

import time

import pytest
import ray

from nemo_opd.config import MathEnvConfig
from nemo_opd.environments import EnvironmentStep, MathEnvironment
from nemo_opd.environments import math_env as math_env_module
from nemo_opd.environments.math_env import _split_evenly

RETRY = "Wrong, try again."


@pytest.fixture(scope="module")
def ray_session():
    """One local Ray instance for this module."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def env(ray_session):
    """Two workers, no retries."""
    environment = MathEnvironment(MathEnvConfig(num_workers=2, retry_on_wrong=False))
    yield environment
    environment.shutdown()


def conversation(answer_text: str) -> list[dict]:
    return [
        {"role": "user", "content": "What is it?"},
        {"role": "assistant", "content": answer_text},
    ]


# (conversation, metadata, correct?)
MIXED = [
    (conversation("So \\boxed{\\frac{1}{2}}."), {"answer": "0.5"}, True),
    (conversation("The answer is 12."), {"answer": "13"}, False),
    (conversation("\\boxed{(1, 2)}"), {"answer": "(1,2)", "attempts": 2}, True),
    ([{"role": "user", "content": "no reply yet"}], {"answer": "4"}, False),
    (
        conversation("\\boxed{3}")
        + [{"role": "user", "content": RETRY}, {"role": "assistant", "content": "\\boxed{4}"}],
        {"answer": "4", "attempts": 1},
        True,
    ),
    (conversation("\\boxed{" + "9" * 5000 + "}"), {"answer": "9"}, False),
    (conversation("\\boxed{9^9^9^9}"), {"answer": 7}, False),
]


def run_mixed(environment: MathEnvironment) -> EnvironmentStep:
    logs = [c for c, _, _ in MIXED]
    meta = [m for _, m, _ in MIXED]
    step = environment.step(logs, meta)
    assert len(step.rewards) == len(step.done) == len(step.next_messages) == len(MIXED)
    assert step.rewards == [1.0 if ok else 0.0 for _, _, ok in MIXED]
    assert [m["attempts"] for m in step.metadata] == [1, 1, 3, 1, 2, 1, 1]
    assert [m["answer"] for m in step.metadata] == [m["answer"] for m in meta]
    assert "attempts" not in MIXED[0][1]  # the caller's metadata is not mutated
    return step


def test_split_evenly():
    assert _split_evenly(7, 3) == [range(0, 3), range(3, 5), range(5, 7)]
    assert _split_evenly(2, 4) == [range(0, 1), range(1, 2), range(2, 2), range(2, 2)]
    assert _split_evenly(0, 2) == [range(0, 0), range(0, 0)]


def test_needs_ray(monkeypatch):
    monkeypatch.setattr(math_env_module.ray, "is_initialized", lambda: False)
    with pytest.raises(RuntimeError, match="ray.init"):
        MathEnvironment(MathEnvConfig(num_workers=1))


def test_mixed_batch_without_retry(env):
    step = run_mixed(env)
    assert step.done == [True] * len(MIXED)
    assert step.next_messages == [None] * len(MIXED)


def test_missing_reference_is_an_error(env):
    with pytest.raises(ValueError, match="answer"):
        env.step([conversation("\\boxed{1}")], [{}])


def test_order_is_preserved(env):
    n = 41  # not a multiple of the worker count
    logs = [conversation(f"\\boxed{{{i if i % 3 else -1}}}") for i in range(n)]
    step = env.step(logs, [{"answer": str(i)} for i in range(n)])
    assert step.rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(n)]
    assert env.step([], []).rewards == []


def test_mixed_batch_with_retry(ray_session):
    environment = MathEnvironment(
        MathEnvConfig(num_workers=1, retry_on_wrong=True, retry_message=RETRY)
    )
    try:
        step = run_mixed(environment)
    finally:
        environment.shutdown()
    assert step.done == [ok for _, _, ok in MIXED]
    assert step.next_messages == [
        None if ok else {"role": "user", "content": RETRY} for _, _, ok in MIXED
    ]
    with pytest.raises(RuntimeError, match="shut down"):
        environment.step([conversation("\\boxed{1}")], [{"answer": "1"}])


def test_slow_and_crashing_checks_count_as_wrong(ray_session):
    """A check past timeout_s, or one that kills its actor, is wrong; the others are graded and
    the environment keeps working with fresh actors."""

    def check(response, reference, max_answer_chars):  # shipped to the actors by value
        import os
        import time

        from nemo_opd.environments import verify

        if "SLOW" in response:
            time.sleep(60)
        if "CRASH" in response:
            os._exit(1)
        return verify(response, reference, max_answer_chars)

    environment = MathEnvironment(MathEnvConfig(num_workers=2, timeout_s=1.0), check=check)
    try:
        responses = [
            "\\boxed{1}",
            "SLOW \\boxed{2}",
            "\\boxed{3}",
            "CRASH \\boxed{4}",
            "\\boxed{5}",
        ]
        logs = [conversation(r) for r in responses]
        meta = [{"answer": str(i + 1)} for i in range(len(responses))]
        start = time.monotonic()
        step = environment.step(logs, meta)
        elapsed = time.monotonic() - start
        assert step.rewards == [1.0, 0.0, 1.0, 0.0, 1.0]
        assert elapsed < 30.0  # far below the 60 s sleep: the slow check was abandoned
        again = environment.step(logs[:1] + logs[2:3], [meta[0], meta[2]])
        assert again.rewards == [1.0, 1.0]
    finally:
        environment.shutdown()
