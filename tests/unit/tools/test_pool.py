"""ToolPool: every hostile call ends in a tool error within its limit, the pool stays healthy
for the next calls, and no worker is left behind. One pool serves the module."""

import json
import threading
import time

import psutil
import pytest

from nemo_opd.tools import ToolCall
from nemo_opd.tools.pool import ToolPool, reply_limit
from nemo_opd.tools.worker import FILE_LIMIT_MB
from nemo_opd.utils.worker_processes import BASE_VARIABLES

TIMEOUT_S = 2.0
MEMORY_MB = 512
MAX_OUTPUT = 1000
HOSTILE = "tests.unit.tools.hostile_tools:"
NAMES = ("Sleeper", "Spinner", "Hog", "Flood", "Printer", "Crasher", "Liar", "Echo")


@pytest.fixture(scope="module")
def pool():
    tools = ["calculator", *(HOSTILE + name for name in NAMES)]
    pool = ToolPool(tools, 2, TIMEOUT_S, MEMORY_MB, MAX_OUTPUT)
    yield pool
    pool.close()


def workers(marker: str = "nemo_opd.tools.worker") -> list[psutil.Process]:
    return [
        p
        for p in psutil.Process().children()
        if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.cmdline())
    ]


# name, arguments -> the error kind it must end in
CASES = [
    ("sleeper", {}, "timeout"),  # never returns
    ("spinner", {}, "timeout"),  # busy in C with the GIL held
    ("hog", {}, "memory"),  # 16 GiB asked for
    ("flood", {"size": 10**10}, "memory"),  # an output of ten gigabytes
    ("flood", {"size": MAX_OUTPUT + 1}, "output_too_large"),
    ("printer", {}, "failed"),  # gigabytes to its stdout: its file limit stops it
    ("crasher", {}, "crash"),
    ("liar", {}, "crash"),  # garbage on the protocol stream
    ("flood", {"size": "many"}, "bad_arguments"),
    ("echo", {"text": "hi", "extra": 1}, "bad_arguments"),
    ("echo", {"text": "number"}, "failed"),  # not text
    ("echo", {"text": "raise"}, "failed"),
    ("calculator", {"expression": "__import__('os')"}, "failed"),
    ("nowhere", {}, "unknown_tool"),
]


def test_hostile_calls_end_in_tool_errors_within_the_limit(pool):
    calls = [ToolCall(name, arguments) for name, arguments, _ in CASES]
    started = time.monotonic()
    results = pool.run(calls)
    elapsed = time.monotonic() - started
    for (name, arguments, kind), result in zip(CASES, results, strict=True):
        assert result.error == kind, (name, arguments, result)
        assert result.content.startswith("Error: ")
        assert len(result.content) < 400
    # 2 workers: the two time-outs run side by side; each replacement takes a worker start
    assert elapsed < 4 * TIMEOUT_S + 20, elapsed


def test_the_pool_answers_normally_afterwards(pool):
    calls = [ToolCall("calculator", {"expression": f"{a} * 7"}) for a in range(6)]
    calls.append(ToolCall("echo", {"text": "hello"}))
    results = pool.run(calls)
    assert [r.content for r in results] == [str(a * 7) for a in range(6)] + ["hello"]
    assert all(r.error is None for r in results)
    assert len(workers()) == 2


def test_output_at_the_limit_is_returned_whole(pool):
    [result] = pool.run([ToolCall("flood", {"size": MAX_OUTPUT})])
    assert result == type(result)("x" * MAX_OUTPUT, None)
    assert reply_limit(MAX_OUTPUT) > 12 * MAX_OUTPUT


def test_close_leaves_no_worker():
    before = {p.pid for p in workers()}
    pool = ToolPool(["calculator"], 2, TIMEOUT_S, MEMORY_MB, MAX_OUTPUT)
    pids = set(pool.pids())
    assert pids <= {p.pid for p in workers()}
    pool.close()
    pool.close()  # twice is safe
    assert not pids & {p.pid for p in workers()}
    assert {p.pid for p in workers()} == before


def test_a_replacement_started_from_a_thread_that_ends_serves_later_calls():
    """Workers die with the thread that started them (PR_SET_PDEATHSIG): the replacements a
    call from a short-lived thread starts (the rollout producer's, which ends after the last
    step) must outlive it and answer the final validation's calls."""
    starters = set(starter_threads())
    pool = ToolPool(["calculator", HOSTILE + "Crasher"], 2, TIMEOUT_S, MEMORY_MB, MAX_OUTPUT)
    try:
        crashed = []

        def producer():  # both workers replaced from this thread, which goes on a while
            crashed.extend(pool.run([ToolCall("crasher", {})] * 2))
            pool.wait_ready()

        thread = threading.Thread(target=producer)
        thread.start()
        thread.join()
        assert [r.error for r in crashed] == ["crash", "crash"]
        calls = [ToolCall("calculator", {"expression": f"{a} * 7"}) for a in range(4)]
        assert [r.content for r in pool.run(calls)] == ["0", "7", "14", "21"]
    finally:
        pool.close()
    assert set(starter_threads()) == starters  # closing the pool ended its starter


def starter_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "tool-pool-starter"]


def test_limits_are_hard_and_the_environment_minimal(monkeypatch):
    """A tool cannot raise its memory or file limit, and sees none of the driver's variables
    but the minimal set and those it is given (tools.pass_env)."""
    monkeypatch.setenv("NEMO_OPD_TEST_SECRET", "hunter2")
    monkeypatch.setenv("NEMO_OPD_TEST_PASSED", "1")
    tools = [HOSTILE + "Limits", HOSTILE + "Environ"]
    pool = ToolPool(tools, 1, TIMEOUT_S, MEMORY_MB, MAX_OUTPUT, pass_env=["NEMO_OPD_TEST_PASSED"])
    try:
        limits, environ = pool.run([ToolCall("limits", {}), ToolCall("environ", {})])
    finally:
        pool.close()
    assert json.loads(limits.content) == {
        "as": [MEMORY_MB * 2**20] * 2,
        "fsize": [FILE_LIMIT_MB * 2**20] * 2,
    }
    names = set(json.loads(environ.content))
    assert "NEMO_OPD_TEST_PASSED" in names and "NEMO_OPD_TEST_SECRET" not in names
    assert names <= {*BASE_VARIABLES, "PYTHONPATH", "NEMO_OPD_TEST_PASSED"}


# expressions whose result the calculator refused by its power rule only for integer
# exponents and rational bases, and computed until its worker was killed otherwise
HUGE = [
    "2**(10**999 + 0.5)",
    "sqrt(2)**(10**999)",
    "binomial(10**9, 5*10**8)",
    "pi**(10**999)",
    "2**(pi*10**999)",
    "(sqrt(2)*2**13000)**13000",
    "exp(exp(exp(100)))",
]


def test_huge_results_are_refused_before_any_work(pool):
    results = pool.run([ToolCall("calculator", {"expression": e}) for e in HUGE])
    for expression, result in zip(HUGE, results, strict=True):
        assert result.error == "failed", (expression, result)
        assert "too large" in result.content, (expression, result)


def test_a_turn_of_hanging_calls_fails_fast_past_its_budget():
    """4 hanging calls of one turn: the first runs until its time-out, which uses up the
    turn's budget; the rest are not run (budget), not each its own time-out and restart."""
    pool = ToolPool([HOSTILE + "Sleeper", "calculator"], 1, 1.0, MEMORY_MB, MAX_OUTPUT,
                    turn_budget_s=1.0)  # fmt: skip
    try:
        hanging = [ToolCall("sleeper", {})] * 4
        first = pool.pids()
        results = pool.run([*hanging, ToolCall("calculator", {"expression": "6 * 7"})],
                           turns=[0, 0, 0, 0, 1])  # fmt: skip
        assert [r.error for r in results] == ["timeout", "budget", "budget", "budget", None]
        assert "used up their 1 s" in results[1].content
        assert results[4].content == "42"
        assert len(set(first) | set(pool.pids())) == 2  # one kill, one restart
    finally:
        pool.close()


def test_a_step_past_its_budget_stops_what_runs_and_runs_nothing_more():
    pool = ToolPool([HOSTILE + "Sleeper", "calculator"], 2, 30.0, MEMORY_MB, MAX_OUTPUT,
                    step_budget_s=1.0)  # fmt: skip
    try:
        calls = [ToolCall("sleeper", {})] * 3 + [ToolCall("calculator", {"expression": "1"})]
        results = pool.run(calls, turns=[0, 1, 2, 3])
        assert [r.error for r in results] == ["budget"] * 4
        assert results[0].content.startswith("Error: stopped: this step's tool calls")
        assert results[3].content.startswith("Error: not run: this step's tool calls")
        pool.wait_ready()  # the next step starts with a budget of its own
        assert pool.run([ToolCall("calculator", {"expression": "6 * 7"})])[0].content == "42"
    finally:
        pool.close()
