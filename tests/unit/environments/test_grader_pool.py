"""GraderPool: hostile responses are graded wrong within the time limit, the pool stays healthy
for the next batch, and nothing leaks (processes, memory). One pool serves the module."""

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import psutil
import pytest

from nemo_opd.environments import grader_pool
from nemo_opd.environments.grader_pool import GraderPool, GraderPoolError

TIMEOUT_S = 2.0
MEMORY_MB = 1024
SILENT_STOP_S = 1.5
"""How long a pool's close waits for a silent worker (it never reads its stdin, so it never
exits of itself) before it kills it, instead of the pool's seconds for a real one."""

# A truncated response about (2+sqrt 3)^1000 whose last formula makes math-verify compare a
# 500-term binomial sum with sympy: minutes on one core, with math-verify's own time-out (a
# signal) unable to fire off the main thread.
BINOMIAL = (
    r"To find the last two digits of $\lfloor (2+\sqrt{3})^{1000} \rfloor$, note that "
    r"$(2+\sqrt{3})^{n} + (2-\sqrt{3})^{n}$ is an integer for every $n \geq 0$. Let $a_n = "
    r"(2+\sqrt{3})^n + (2-\sqrt{3})^n$. Then $a_0 = 2$, $a_1 = 4$, and $a_{n+2} = 4a_{n+1} - "
    r"a_n$. Since $0 < (2-\sqrt{3})^{1000} < 1$, we get $\lfloor (2+\sqrt{3})^{1000} \rfloor = "
    r"a_{1000} - 1$. Working modulo $100$: $a_2 = 14$, $a_3 = 52$, $a_4 = 194 \equiv 94$, $a_5 "
    r"= 4 \cdot 94 - 52 = 324 \equiv 24$, and so on. The sequence repeats, so by the binomial "
    r"theorem the integer part is $\sum_{k=0}^{500}\binom{1000}{2k}2^{1001-2k}3^{k} - 1$ and "
    r"reducing this modulo one hundred term by term gives the last two digits as"
)

# (response, reference): every one must be graded wrong
HOSTILE = {
    "(2+sqrt 3)^1000 binomial sum": (BINOMIAL, "1"),
    "1 MB response": ("So the answer is clear. " * 45_000 + "\\boxed{5}.", "4"),
    "1 MB without an answer": ("7 " * 500_000, "5"),
    "deeply nested braces": ("\\boxed{" + "{" * 10_000 + "5" + "}" * 10_000 + "}", "5"),
    "deep parentheses": ("\\boxed{" + "(" * 3_000 + "5" + ")" * 3_000 + "}", "5"),
    "a box of 10^6 digits": ("\\boxed{" + "9" * 10**6 + "}", "9"),
    "a huge power": ("\\boxed{7^{100000000}}", "7"),
    "a power tower": ("\\boxed{10^{10^{10}}}", "1"),
    "NUL bytes": ("\\boxed{5\x00}\x00\x00", "5"),
    "invalid UTF-8": (b"\\boxed{5}\xff\xfe".decode(errors="surrogateescape"), "5"),
    "a direction override": ("\\boxed{\u202e5}", "5"),
}
NORMAL = [
    (r"3 + 9 = 12. \boxed{12}", "12", True),
    (r"so $\boxed{\frac{x}{7}+\frac{2}{7}}$", r"\frac{x+2}{7}", True),
    (r"\boxed{13}", "12", False),
    (r"The roots are $\boxed{2, 3}$.", r"\{3, 2\}", True),
]


@pytest.fixture(scope="module")
def pool():
    pool = GraderPool(2, TIMEOUT_S, 1000, "math_verify", MEMORY_MB)
    yield pool
    pool.close()


def grade_normal(pool: GraderPool) -> None:
    report = pool.grade([r for r, _, _ in NORMAL], [ref for _, ref, _ in NORMAL])
    assert report.verdicts == [ok for _, _, ok in NORMAL]
    assert report.timeouts == report.crashes == 0


def live_children(marker: str = "grader_worker") -> list[psutil.Process]:
    """This process's children whose command line holds marker (other test modules of the same
    session may leave processes of their own, Ray's for one)."""
    return [
        p
        for p in psutil.Process().children()
        if p.status() != psutil.STATUS_ZOMBIE and marker in " ".join(p.cmdline())
    ]


def test_hostile_responses_are_wrong_within_the_limit(pool):
    grade_normal(pool)
    before = set(pool.pids())
    names = list(HOSTILE)
    start = time.monotonic()
    report = pool.grade([HOSTILE[n][0] for n in names], [HOSTILE[n][1] for n in names])
    elapsed = time.monotonic() - start
    assert dict(zip(names, report.verdicts, strict=True)) == dict.fromkeys(names, False)
    # the binomial sum, the huge power and the tower overran and had their workers replaced
    assert report.timeouts >= 3
    assert report.crashes == 0
    # each overrun costs at most TIMEOUT_S of one worker; the rest is quick
    assert elapsed < report.timeouts * TIMEOUT_S + 15.0
    assert not before & set(pool.pids())


def test_the_pool_stays_healthy_and_nothing_leaks(pool):
    grade_normal(pool)
    pool.wait_ready()
    children = live_children()
    assert sorted(p.pid for p in children) == sorted(pool.pids())  # the killed ones are reaped
    for process in children:
        assert process.memory_info().rss < MEMORY_MB * 2**20
        with open(f"/proc/{process.pid}/limits") as limits:
            line = next(row for row in limits if row.startswith("Max address space"))
        assert int(line.split()[3]) == MEMORY_MB * 2**20


def test_a_worker_killed_mid_answer_is_replaced(pool):
    pool.wait_ready()  # the first worker gets the first answer
    victim = pool.pids()[0]
    killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
    killer.start()
    report = pool.grade([BINOMIAL, r"\boxed{12}"], ["1", "12"])
    killer.join()
    assert report.verdicts == [False, True]
    assert report.crashes == 1 and report.timeouts == 0
    assert victim not in pool.pids()
    grade_normal(pool)


def test_a_worker_that_cannot_start_is_an_error(monkeypatch):
    monkeypatch.setattr(grader_pool, "_STOP_TIMEOUT_S", SILENT_STOP_S)
    monkeypatch.setattr(grader_pool, "worker_command", lambda *a: [sys.executable, "-c", "1/0"])
    with pytest.raises(GraderPoolError, match="(?s)exited while starting: .*ZeroDivisionError"):
        GraderPool(1, TIMEOUT_S, 1000, "math_verify", MEMORY_MB)
    monkeypatch.setattr(grader_pool, "READY_TIMEOUT_S", 0.5)
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(grader_pool, "worker_command", lambda *a: silent)
    with pytest.raises(GraderPoolError, match="did not start within"):
        GraderPool(1, TIMEOUT_S, 1000, "math_verify", MEMORY_MB)
    assert not live_children("time.sleep")


def test_a_pool_that_does_not_wait_reports_a_failed_start_when_waited_for(monkeypatch):
    """wait=False returns while the workers start; wait_ready() (or the first grade) raises what
    the constructor would have raised."""
    monkeypatch.setattr(grader_pool, "_STOP_TIMEOUT_S", SILENT_STOP_S)
    monkeypatch.setattr(grader_pool, "READY_TIMEOUT_S", 0.5)
    silent = [sys.executable, "-c", "import time; time.sleep(60)"]
    monkeypatch.setattr(grader_pool, "worker_command", lambda *a: silent)
    pool = GraderPool(1, TIMEOUT_S, 1000, "builtin", MEMORY_MB, wait=False)
    try:
        with pytest.raises(GraderPoolError, match="did not start within"):
            pool.wait_ready()
    finally:
        pool.close()
    assert not live_children("time.sleep")


def test_a_pool_that_does_not_wait_grades_once_its_workers_are_ready():
    pool = GraderPool(1, TIMEOUT_S, 1000, "builtin", MEMORY_MB, wait=False)
    try:
        assert pool.grade([r"\boxed{12}", r"\boxed{13}"], ["12", "12"]).verdicts == [True, False]
    finally:
        pool.close()


def test_workers_die_with_their_parent():
    """A driver killed with SIGKILL (no clean-up runs) leaves no grader behind."""
    code = textwrap.dedent(
        """
        import time
        from nemo_opd.environments.grader_pool import GraderPool
        pool = GraderPool(2, 5.0, 1000, "builtin", 512)  # any grader's workers: the lightest
        print(*pool.pids(), flush=True)
        time.sleep(60)
        """
    )
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pids = [int(pid) for pid in driver.stdout.readline().split()]
    assert len(pids) == 2
    driver.kill()
    driver.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(psutil.pid_exists(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(psutil.pid_exists(pid) for pid in pids)
    driver.stdout.close()


def test_closed_pool():
    pool = GraderPool(1, TIMEOUT_S, 1000, "builtin", MEMORY_MB)
    pids = pool.pids()
    assert pool.grade([r"\boxed{12}"], ["12"]).verdicts == [True]
    pool.close()
    pool.close()
    assert not any(psutil.pid_exists(pid) for pid in pids)
    with pytest.raises(RuntimeError, match="closed"):
        pool.grade(["1"], ["1"])


def test_marked_answers_only_through_the_workers(pool):
    unmarked, marked = "7 + 112 =", r"7 + 112 = 119. \boxed{119}"
    assert pool.grade([unmarked, marked], ["119", "119"]).verdicts == [True, True]
    strict = GraderPool(1, TIMEOUT_S, 1000, "math_verify", MEMORY_MB, marked_only=True)
    try:
        report = strict.grade([unmarked, marked, "The answer is 7 + 112."], ["119"] * 3)
        assert report.verdicts == [False, True, True] and report.fast >= 1
    finally:
        strict.close()


def test_a_replacement_started_from_a_thread_that_ends_grades_later_answers():
    """Workers die with the thread that started them (PR_SET_PDEATHSIG): replacements that a
    short-lived thread's call starts (the rollout producer's, which ends after the last step)
    must outlive it and grade the final validation's answers."""
    pool = GraderPool(2, TIMEOUT_S, 1000, "builtin", MEMORY_MB)
    try:
        for pid in pool.pids():
            os.kill(pid, signal.SIGKILL)
            psutil.Process(pid).wait(timeout=10)
        reports = []

        def producer():  # both workers replaced from this thread, which goes on a while
            reports.append(pool.grade([r"\boxed{1}"] * 2, ["1"] * 2))
            pool.wait_ready()

        thread = threading.Thread(target=producer)
        thread.start()
        thread.join()
        assert reports[0].crashes == 2
        report = pool.grade([r"\boxed{12}", r"\boxed{13}", r"\boxed{5}"], ["12", "12", "5"])
        assert report.verdicts == [True, False, True] and report.crashes == 0
    finally:
        pool.close()


def test_the_engine_loads_on_the_first_answer_the_fast_path_leaves_to_it():
    """A worker loads math-verify for the first answer that needs it, and only then: answers
    the fast path settles load nothing. The load has a limit of its own: the answer's limit
    here (1 s, twenty times the answer's own 0.05 s) is no longer than the load (1.0 s on an
    idle 2-core machine, more on a busy one), and still the answer is graded, not timed out."""
    pool = GraderPool(1, 1.0, 1000, "math_verify", MEMORY_MB)
    try:
        report = pool.grade([r"3 + 9 = 12. \boxed{12}", r"\boxed{13}"], ["12", "12"])
        assert (report.verdicts, report.fast, report.loads) == ([True, False], 2, 0)
        engine = NORMAL[1][:2]  # \frac{x}{7}+\frac{2}{7} against \frac{x+2}{7}
        report = pool.grade([engine[0]], [engine[1]])
        assert (report.verdicts, report.loads, report.timeouts) == ([True], 1, 0)
        report = pool.grade([NORMAL[3][0]], [NORMAL[3][1]])  # loaded already
        assert (report.verdicts, report.loads, report.timeouts) == ([True], 0, 0)
    finally:
        pool.close()


BROKEN_ENGINES = {
    "grades nothing": (
        "class LatexExtractionConfig:\n    def __init__(self, **kwargs): pass\n"
        "ExprExtractionConfig = LatexExtractionConfig\n"
        "def parse(*args, **kwargs): return []\n"
        "def verify(*args, **kwargs): return False\n",
        "math-verify graded a right answer wrong",
    ),
    "fails to import": (
        "raise ImportError('the ANTLR runtime of another version')\n",
        "math-verify could not grade: ImportError: the ANTLR runtime of another version",
    ),
}


@pytest.mark.parametrize("broken", list(BROKEN_ENGINES))
def test_an_engine_that_cannot_grade_ends_the_run_instead_of_grading_wrong(
    broken, tmp_path, monkeypatch
):
    """A math-verify that imports but grades a right answer wrong (a broken install), or fails
    to import, stops grading with the reason once an answer needs it: every such answer
    graded wrong would pass as a weak student. Answers the fast path settles are graded."""
    source, reason = BROKEN_ENGINES[broken]
    (tmp_path / "math_verify").mkdir()
    (tmp_path / "math_verify" / "__init__.py").write_text(source)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the workers' PYTHONPATH ends with it
    pool = GraderPool(1, TIMEOUT_S, 1000, "math_verify", MEMORY_MB)
    try:
        assert pool.grade([r"\boxed{12}"], ["12"]).verdicts == [True]
        with pytest.raises(GraderPoolError) as raised:
            pool.grade([NORMAL[1][0]], [NORMAL[1][1]])
    finally:
        pool.close()
    message = str(raised.value)
    assert message.startswith("a grader worker exited while loading its grading engine: ")
    assert reason in message and "or set env.math.grader=builtin" in message, message


def test_an_engine_that_is_not_installed_is_refused_when_the_worker_starts(monkeypatch):
    from nemo_opd.environments import math_verify

    math_verify.check_engine_installed("math_verify")  # this environment has it
    monkeypatch.setattr(math_verify.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(math_verify.EngineError, match="math-verify package is not installed"):
        math_verify.check_engine_installed("math_verify")
    math_verify.check_engine_installed("builtin")  # needs nothing
