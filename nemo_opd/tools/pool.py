"""Tool calls in worker processes, each with a time, a memory and an output-size limit.

ToolPool keeps num_workers tool worker processes (nemo_opd.tools.worker), each holding every
configured tool, and at most one call in flight in each; the next call goes to whichever
worker is free. Limits per call, each ending in a tool error the model reads (never an
exception in the driver):

- time: a call not answered within timeout_s of being sent is a "timeout": its worker is
  killed (SIGKILL stops it even inside C code that holds the GIL) and a new one started while
  the others go on;
- memory: each worker's address space is capped at memory_mb; an allocation past it is a
  "memory" error and the worker goes on (a worker the kernel kills instead is a "crash");
- output: the worker refuses an output longer than max_output_chars ("output_too_large"), and
  the pool reads at most reply_limit() bytes of any reply: a worker that writes more (a tool
  writing to the protocol stream itself) is killed, with the same error.

Budgets over calls, so that a turn of hanging calls cannot hold a batch for its calls' time
outs one after another (and the replacements' starts between them): a turn's calls (one
assistant turn's) have turn_budget_s from the moment its first call is sent, a run's calls
(one environment step of the batch) step_budget_s from the start of the run. A call whose
budget has run out is not sent, and one in flight when it runs out is stopped as a time-out
is: either way a "budget" error. None: no budget.

A worker that dies is replaced and its call is a "crash". Every wait has a time-out: a worker
that does not report ready within READY_TIMEOUT_S, or dies before it does, raises
ToolPoolError with the end of its stderr. Workers are started from a thread of the pool's own
(nemo_opd.utils.worker_processes: they die with the thread that starts them) with a minimal
environment (the driver's secrets stay in the driver; pass_env names what a tool needs). The
pattern is the math grader's (nemo_opd.environments.grader_pool).
"""

import json
import math
import os
import selectors
import subprocess
import sys
import tempfile
import time
import weakref
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from nemo_opd.tools.base import ERROR_KINDS, ToolCall, ToolResult
from nemo_opd.utils.worker_processes import WorkerStarter, stop_process, worker_environment

READY_TIMEOUT_S = 60.0
"""How long a new worker may take to load its tools (the calculator imports sympy)."""

_STOP_TIMEOUT_S = 5.0
_STDERR_TAIL = 2000


class ToolPoolError(RuntimeError):
    """A tool worker could not be started."""


def reply_limit(max_output_chars: int) -> int:
    """Most bytes a reply line may take: JSON writes a character as at most 12 bytes (a
    surrogate pair escaped as two \\uXXXX), plus the envelope."""
    return 12 * max_output_chars + 1024


@dataclass
class _Worker:
    """One worker process and the call it is running (job), if any: when it must be answered
    (deadline) and the error if it is not (overrun: kind, message)."""

    process: subprocess.Popen
    stderr: object
    ready: bool = False
    job: int | None = None
    deadline: float = 0.0
    overrun: tuple[str, str] = ("timeout", "")
    buffer: bytearray = field(default_factory=bytearray)


class _Budgets:
    """The time left to the calls of one run (module docstring): each turn's, from its first
    call's start, and the run's, from now."""

    def __init__(self, turn_s: float | None, step_s: float | None, turns: Sequence[int]):
        self.turn_s, self.step_s, self.turns = turn_s, step_s, turns
        self.step_end = math.inf if step_s is None else time.monotonic() + step_s
        self.turn_end: dict[int, float] = {}

    def start(self, job: int, now: float) -> None:
        """The job is being sent: its turn's clock starts if this is the turn's first call."""
        end = math.inf if self.turn_s is None else now + self.turn_s
        self.turn_end.setdefault(self.turns[job], end)

    def end(self, job: int) -> tuple[float, str]:
        """When the job's budget runs out, and what the model reads then."""
        turn_end = self.turn_end.get(self.turns[job], math.inf)
        if turn_end < self.step_end:
            return turn_end, f"this turn's tool calls used up their {self.turn_s:g} s"
        if self.step_s is None:
            return math.inf, ""
        return self.step_end, f"this step's tool calls used up their {self.step_s:g} s"


class ToolPool:
    """num_workers tool workers (module docstring).

    Args:
        tools: the tools' config names (tools.base.load_tool).
        num_workers: worker processes.
        timeout_s: wall-clock seconds a call may take.
        memory_mb: address-space cap of each worker.
        max_output_chars: longest output a call may return.
        turn_budget_s: wall-clock seconds for the calls of one turn (None: no budget).
        step_budget_s: wall-clock seconds for the calls of one run() (None: no budget).
        pass_env: names of environment variables the workers get from the driver's, besides
            the minimal set (nemo_opd.utils.worker_processes.BASE_VARIABLES).
    """

    def __init__(
        self,
        tools: list[str],
        num_workers: int,
        timeout_s: float,
        memory_mb: int,
        max_output_chars: int,
        *,
        turn_budget_s: float | None = None,
        step_budget_s: float | None = None,
        pass_env: Sequence[str] = (),
    ):
        self.timeout_s = timeout_s
        self.turn_budget_s, self.step_budget_s = turn_budget_s, step_budget_s
        self._reply_limit = reply_limit(max_output_chars)
        self._command = [
            sys.executable,
            "-m",
            "nemo_opd.tools.worker",
            *(f"--tool={tool}" for tool in tools),
            f"--memory-mb={memory_mb}",
            f"--max-output-chars={max_output_chars}",
            f"--parent={os.getpid()}",
        ]
        self._env = worker_environment(pass_env)
        self._selector = selectors.DefaultSelector()
        self._results: list[ToolResult | None] = []
        self._workers: list[_Worker] = []
        self._starter = WorkerStarter("tool-pool-starter")
        self._finalizer = weakref.finalize(self, _stop_all, self._workers, self._starter)
        for _ in range(num_workers):
            self._workers.append(self._start())
        self.wait_ready()

    def wait_ready(self) -> None:
        """Return once every worker (replacements included) has loaded its tools."""
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not all(w.ready for w in self._workers):
            self._wait(deadline)

    # ------------------------------------------------------------------------------ calls

    def run(self, calls: list[ToolCall], turns: Sequence[int] | None = None) -> list[ToolResult]:
        """Every call's result, in order (module docstring for the limits and budgets);
        turns[i] names the turn of call i (calls of a turn next to each other; None: each
        call a turn of its own)."""
        if not self._workers:
            raise RuntimeError("ToolPool was closed")
        budgets = _Budgets(self.turn_budget_s, self.step_budget_s, turns or range(len(calls)))
        self._results = [None] * len(calls)
        pending = deque(range(len(calls)))
        requests = [json.dumps({"name": c.name, "arguments": c.arguments}) for c in calls]
        while pending or any(w.job is not None for w in self._workers):
            self._expire(pending, budgets)
            for worker in self._workers:
                if worker.ready and worker.job is None and pending:
                    job = pending.popleft()
                    self._send(worker, job, requests[job].encode(), budgets)
            self._wait(budgets.end(pending[0])[0] if pending else None)
        results, self._results = self._results, []
        return results

    def _expire(self, pending: deque, budgets: _Budgets) -> None:
        """Fail, unsent, the waiting calls whose budget has run out. Calls are sent in order,
        so only the first waiting call's turn can have started: the calls behind it have the
        same budget, or the run's alone."""
        now = time.monotonic()
        while pending:
            end, message = budgets.end(pending[0])
            if end > now:
                return
            self._results[pending.popleft()] = ToolResult(f"Error: not run: {message}", "budget")

    def _send(self, worker: _Worker, job: int, request: bytes, budgets: _Budgets) -> None:
        """Give a call to an idle worker, with the earlier of its time limit and its budget;
        one that died meanwhile is replaced (a crash)."""
        now = time.monotonic()
        budgets.start(job, now)
        end, message = budgets.end(job)
        worker.job, worker.deadline = job, now + self.timeout_s
        worker.overrun = ("timeout", f"the call took longer than {self.timeout_s:g} s")
        if end < worker.deadline:
            worker.deadline, worker.overrun = end, ("budget", f"stopped: {message}")
        try:
            worker.process.stdin.write(request + b"\n")
            worker.process.stdin.flush()
        except OSError:  # BrokenPipeError: it died since its last reply
            self._fail(worker, "crash", "the tool's worker process died")

    def _wait(self, deadline: float | None) -> None:
        """Wait for output until the earliest deadline (a call in flight, a worker starting,
        or the given one); handle replies, deaths and overruns."""
        deadlines = [w.deadline for w in self._workers if w.job is not None or not w.ready]
        if deadline is not None and deadline < math.inf:
            deadlines.append(deadline)
        timeout = max(0.0, min(deadlines) - time.monotonic()) if deadlines else None
        for key, _ in self._selector.select(timeout):
            self._read(key.data)
        now = time.monotonic()
        for worker in list(self._workers):
            if worker.deadline > now or (worker.ready and worker.job is None):
                continue
            if not worker.ready:
                message = f"a tool worker did not start within {READY_TIMEOUT_S:.0f} s"
                raise ToolPoolError(message + _stderr_tail(worker))
            self._fail(worker, *worker.overrun)

    def _read(self, worker: _Worker) -> None:
        """Take what a worker wrote: "ready", a reply, or end of file (it died)."""
        chunk = os.read(worker.process.stdout.fileno(), 65536)
        if not chunk:
            if not worker.ready:
                raise ToolPoolError("a tool worker exited while starting" + _stderr_tail(worker))
            self._fail(worker, "crash", "the tool's worker process died")
            return
        worker.buffer += chunk
        while b"\n" in worker.buffer:
            line, _, rest = worker.buffer.partition(b"\n")
            worker.buffer = bytearray(rest)
            if not self._take(worker, bytes(line)):
                return
        if len(worker.buffer) > self._reply_limit:
            self._fail(worker, "output_too_large", "the tool wrote more than its output limit")

    def _take(self, worker: _Worker, line: bytes) -> bool:
        """Handle one line of a worker; False when the worker was killed for it."""
        if len(line) > self._reply_limit:
            self._fail(worker, "output_too_large", "the tool wrote more than its output limit")
            return False
        message = _decode(line)
        if message == "ready" and not worker.ready:
            worker.ready = True
        elif isinstance(message, ToolResult) and worker.job is not None:
            self._results[worker.job], worker.job = message, None
        else:
            self._fail(worker, "crash", "the tool's worker sent an unreadable reply")
            return False
        return True

    def _fail(self, worker: _Worker, kind: str, message: str) -> None:
        """The worker's call fails with `kind`; the worker is killed and replaced."""
        if worker.job is not None:
            self._results[worker.job] = ToolResult(f"Error: {message}", kind)
        self._replace(worker)

    # ------------------------------------------------------------------------------ processes

    def _start(self) -> _Worker:
        """A new worker process, registered for reading (not yet ready)."""
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _stop with the worker)
        process = self._starter.popen(
            self._command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=self._env,
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


def _decode(line: bytes) -> str | ToolResult | None:
    """A worker's line: "ready", a ToolResult, or None when it is neither."""
    try:
        message = json.loads(line)
    except ValueError:
        return None
    if message == "ready":
        return message
    if isinstance(message, dict) and isinstance(message.get("content"), str):
        error = message.get("error")
        known = error is None or error in ERROR_KINDS
        return ToolResult(message["content"], error if known else "failed")
    return None


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
