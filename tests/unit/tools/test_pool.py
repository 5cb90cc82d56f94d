"""ToolPool: every hostile call ends in a tool error within its limit, the pool stays healthy
for the next calls, and no worker is left behind. One pool serves the module."""

import time

import psutil
import pytest

from nemo_opd.tools import ToolCall
from nemo_opd.tools.pool import ToolPool, reply_limit

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
