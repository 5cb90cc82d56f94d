"""MathEnvironment: rewards, done flags, retry messages, order, metrics. Its grader processes'
time limits and hostile answers: test_grader_pool.py."""

import pytest

from nemo_opd.config import EnvConfig, MathEnvConfig
from nemo_opd.environments import EnvironmentStep, MathEnvironment
from nemo_opd.environments.build import build_environments, wait_for_environments

RETRY = "Wrong, try again."


@pytest.fixture(scope="module")
def env():
    """Two grader workers, no retries."""
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
    (conversation("so the answer is $x \\in [-2, 7]$"), {"answer": "$-2 \\leq x \\leq 7$"}, True),
    # an answer that is not marked (box, answer phrase) is wrong, even where math-verify would
    # evaluate it to the reference (env.math.require_marked_answer, the default)
    (conversation("7 + 112 ="), {"answer": "119"}, False),
]


def run_mixed(environment: MathEnvironment) -> EnvironmentStep:
    logs = [c for c, _, _ in MIXED]
    meta = [m for _, m, _ in MIXED]
    step = environment.step(logs, meta)
    assert len(step.rewards) == len(step.done) == len(step.next_messages) == len(MIXED)
    assert step.rewards == [1.0 if ok else 0.0 for _, _, ok in MIXED]
    assert [m["attempts"] for m in step.metadata] == [1, 1, 3, 1, 2, 1, 1, 1, 1]
    assert [m["answer"] for m in step.metadata] == [m["answer"] for m in meta]
    assert "attempts" not in MIXED[0][1]  # the caller's metadata is not mutated
    return step


def test_mixed_batch_without_retry(env):
    step = run_mixed(env)
    assert step.done == [True] * len(MIXED)
    assert step.next_messages == [None] * len(MIXED)
    # settled without math-verify: the pair, the retried box, the 5000-digit box, and (no
    # marked answer) the empty reply and the restated question
    assert step.metrics == {
        "graded": 9.0,
        "fast_path": 5.0,
        "grader_timeouts": 0.0,
        "grader_crashes": 0.0,
    }


def test_missing_reference_is_an_error(env):
    with pytest.raises(ValueError, match="answer"):
        env.step([conversation("\\boxed{1}")], [{}])


def test_order_is_preserved(env):
    n = 41  # not a multiple of the worker count
    logs = [conversation(f"\\boxed{{{i if i % 3 else -1}}}") for i in range(n)]
    step = env.step(logs, [{"answer": str(i)} for i in range(n)])
    assert step.rewards == [0.0 if i % 3 == 0 else 1.0 for i in range(n)]
    assert env.step([], []).rewards == []


def test_mixed_batch_with_retry():
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
    environment.shutdown()  # twice is fine
    with pytest.raises(RuntimeError, match="closed"):
        environment.step([conversation("\\boxed{1}")], [{"answer": "1"}])


def test_environments_built_without_waiting_grade_once_waited_for():
    """setup starts the graders' processes first and waits for them after vLLM has loaded."""
    config = EnvConfig(math=MathEnvConfig(num_workers=1, grader="builtin", retry_on_wrong=False))
    environments = build_environments(config, wait=False)
    try:
        wait_for_environments(environments)
        step = environments["math"].step([conversation("\\boxed{4}")], [{"answer": "4"}])
        assert step.rewards == [1.0]
    finally:
        environments["math"].shutdown()
