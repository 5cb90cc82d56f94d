"""Grading in worker processes, with a hard wall-clock limit on every answer.

GraderPool keeps num_workers grader_worker processes and at most one answer in flight in each;
the next answer goes to whichever worker is free. An answer that is not graded within timeout_s
of being sent counts as wrong: its worker is killed (SIGKILL stops it even inside C code that
holds the GIL, as sympy's big-integer arithmetic does) and a new one started, while the other
workers go on. A worker that dies (a crash, the kernel's out-of-memory killer) is replaced the
same way and its answer counts as wrong. Each worker is one Python process (its address space
capped at memory_mb; its size: docs/generation.md) that loads math-verify on the first answer
the fast path leaves to it (grader_worker): the load has a limit of its own, READY_TIMEOUT_S,
and the answer its timeout_s after it. A worker that cannot load its engine, or does not within
the limit, raises GraderPoolError with the end of its stderr: an engine that is not there must
stop the run, not grade every answer that needs it wrong.

Before an answer is sent, the response and the reference are cut to their last
math_verify.RESPONSE_WINDOW_CHARS characters (from the response's last \\boxed{} when that lies
earlier), so what crosses the pipe is bounded whatever a model writes.

Every wait has a time-out: a worker that does not report ready within READY_TIMEOUT_S, or dies
before it does, raises GraderPoolError with the end of its stderr. Workers are started from a
thread of the pool's own (they die with the thread that starts them, so not from the caller's,
which may end first) with a minimal environment (nemo_opd.utils.worker_processes).
"""

import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from dataclasses import dataclass, field

from nemo_opd.environments.math_verify import Grader, response_window
from nemo_opd.utils.worker_processes import WorkerStarter, stop_process, worker_environment

READY_TIMEOUT_S = 60.0
"""How long a new grader worker may take to start, and to load its engine (docs/generation.md has
the time it takes)."""

_STOP_TIMEOUT_S = 5.0
"""How long close() waits for a worker to exit after its stdin is closed, before killing it."""

_STDERR_TAIL = 2000
"""Bytes of a failed worker's stderr quoted in the error."""


class GraderPoolError(RuntimeError):
    """A grader worker could not be started."""


@dataclass
class GradeReport:
    """The verdicts of one grade() call, in input order, with what happened on the way.

    fast: answers the fast path settled (no math-verify); timeouts: answers that overran the
    limit (their workers killed); crashes: answers whose worker died while grading them;
    loads: workers that loaded their engine for one of these answers.
    """

    verdicts: list[bool]
    fast: int = 0
    timeouts: int = 0
    crashes: int = 0
    loads: int = 0


@dataclass
class _Worker:
    """One grader process and the answer it is grading (job), if any."""

    process: subprocess.Popen
    stderr: object
    ready: bool = False
    loading: bool = False  # loading its engine (between its "loading" and "loaded" lines)
    job: int | None = None
    deadline: float = 0.0
    buffer: bytearray = field(default_factory=bytearray)


def _request(response: str, reference: str) -> bytes:
    """One request line; ensure_ascii escapes NUL bytes and lone surrogates."""
    window = {"response": response_window(response), "reference": response_window(reference)}
    return json.dumps(window).encode()


def worker_command(
    grader: Grader, max_answer_chars: int, memory_mb: int, marked_only: bool
) -> list[str]:
    """The command line of a grader worker of this process."""
    return [
        sys.executable,
        "-m",
        "nemo_opd.environments.grader_worker",
        f"--grader={grader}",
        f"--max-answer-chars={max_answer_chars}",
        f"--memory-mb={memory_mb}",
        f"--parent={os.getpid()}",
        *(["--marked-only"] if marked_only else []),
    ]


class GraderPool:
    """num_workers grader processes (see the module docstring)."""

    def __init__(
        self,
        num_workers: int,
        timeout_s: float,
        max_answer_chars: int,
        grader: Grader,
        memory_mb: int,
        marked_only: bool = False,
        wait: bool = True,
    ):
        """wait: return once every worker is ready (else they start in the background;
        wait_ready() or the first grade() waits for them, each with the same time-out)."""
        self.timeout_s = timeout_s
        self._command = worker_command(grader, max_answer_chars, memory_mb, marked_only)
        self._selector = selectors.DefaultSelector()
        self._report: GradeReport | None = None  # of the grade() call under way
        self._workers: list[_Worker] = []
        self._starter = WorkerStarter("grader-pool-starter")
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._starter)
        for _ in range(num_workers):
            self._workers.append(self._start())
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Return once every worker (replacements included) has started."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(w.ready for w in self._workers):
            self._wait(deadline)

    # ------------------------------------------------------------------------------ grading

    def grade(self, responses: list[str], references: list[str]) -> GradeReport:
        """Whether each response's final answer matches its reference (see the module
        docstring for what counts as wrong)."""
        if not self._workers:
            raise RuntimeError("GraderPool was closed")
        if len(responses) != len(references):
            raise ValueError(f"{len(responses)} responses but {len(references)} references")
        self._report = report = GradeReport(verdicts=[False] * len(responses))
        pending = deque(range(len(responses)))
        requests = [_request(r, ref) for r, ref in zip(responses, references, strict=True)]
        try:
            while pending or any(w.job is not None for w in self._workers):
                for worker in self._workers:
                    if worker.ready and worker.job is None and pending:
                        job = pending.popleft()
                        self._send(worker, job, requests[job])
                self._wait(None)
        finally:
            self._report = None
        return report

    def _send(self, worker: _Worker, job: int, request: bytes) -> None:
        """Give job to an idle worker; a worker that died meanwhile is replaced (the answer
        counts as a crash)."""
        worker.job, worker.deadline = job, time.monotonic() + self.timeout_s
        try:
            worker.process.stdin.write(request + b"\n")
            worker.process.stdin.flush()
        except OSError:  # BrokenPipeError: it died since its last reply
            self._report.crashes += 1
            self._replace(worker)

    def _wait(self, deadline: float | None) -> None:
        """Wait for output from the workers until the earliest deadline (of an answer in flight,
        of a worker starting, or the given one); handle replies, deaths and overruns."""
        now = time.monotonic()
        deadlines = [w.deadline for w in self._workers if w.job is not None or not w.ready]
        if deadline is not None:
            deadlines.append(deadline)
        timeout = max(0.0, min(deadlines) - now) if deadlines else None
        for key, _ in self._selector.select(timeout):
            self._read(key.data)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.deadline > now or (worker.ready and worker.job is None):
                continue
            if not worker.ready or worker.loading:
                what = "start" if not worker.ready else "load its grading engine"
                raise GraderPoolError(
                    f"a grader worker did not {what} within {READY_TIMEOUT_S:.0f} s"
                    + _stderr_tail(worker)
                )
            self._report.timeouts += 1
            self._replace(worker)

    def _read(self, worker: _Worker) -> None:
        """Take what a worker wrote: "ready", "loading", "loaded", verdicts, or end of file (it
        died)."""
        chunk = os.read(worker.process.stdout.fileno(), 65536)
        if not chunk:
            if not worker.ready or worker.loading:
                what = "starting" if not worker.ready else "loading its grading engine"
                raise GraderPoolError(f"a grader worker exited while {what}" + _stderr_tail(worker))
            self._report.crashes += worker.job is not None
            self._replace(worker)
            return
        worker.buffer += chunk
        while b"\n" in worker.buffer:
            line, _, rest = worker.buffer.partition(b"\n")
            worker.buffer = bytearray(rest)
            message = json.loads(line)
            if message == "ready":
                worker.ready = True
                continue
            if message == "loading":  # the load's own limit, then the answer's
                worker.loading, worker.deadline = True, time.monotonic() + READY_TIMEOUT_S
                self._report.loads += 1
                continue
            if message == "loaded":
                worker.loading, worker.deadline = False, time.monotonic() + self.timeout_s
                continue
            correct, how = message
            self._report.verdicts[worker.job] = bool(correct)
            self._report.fast += how == "fast"
            worker.job = None

    # ------------------------------------------------------------------------------ processes

    def _start(self) -> _Worker:
        """A new worker process, registered for reading (not yet ready)."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _stop with the worker)
        process = self._starter.popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=worker_environment(),
            start_new_session=True,
        )
        worker = _Worker(process, stderr, deadline=time.monotonic() + READY_TIMEOUT_S)
        self._selector.register(process.stdout, selectors.EVENT_READ, worker)
        return worker

    def _replace(self, worker: _Worker) -> None:
        """Kill a worker and start a new one in its place (not waited for)."""
        self._selector.unregister(worker.process.stdout)
        _stop(worker, kill=True)
        self._workers[self._workers.index(worker)] = self._start()

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in self._workers]

    def close(self) -> None:
        """Stop every worker (safe to call twice)."""
        for worker in self._workers:
            self._selector.unregister(worker.process.stdout)
        self._finalizer()
        self._selector.close()


def _stop(worker: _Worker, kill: bool) -> None:
    """End a worker (utils/worker_processes.stop_process)."""
    stop_process(worker.process, worker.stderr, kill, _STOP_TIMEOUT_S)


def _stop_all(workers: list[_Worker], starter: WorkerStarter) -> None:
    """Stop every worker of a pool and empty the list, then the thread that started them (also
    run when the pool is collected)."""
    while workers:
        _stop(workers.pop(), kill=False)
    starter.close()


def _stderr_tail(worker: _Worker) -> str:
    """ ": <the end of a worker's stderr>", or "" if it wrote nothing."""
    worker.stderr.seek(0, os.SEEK_END)
    size = worker.stderr.tell()
    worker.stderr.seek(max(0, size - _STDERR_TAIL))
    text = worker.stderr.read().decode(errors="replace").strip()
    return f": {text}" if text else ""
