"""A teacher with another tokenizer scored off the driver's thread: a pool of render workers.

A served teacher runs no code of ours, so the rows it scores in its own tokens are rendered,
and its answers mapped onto the student's positions, by the run (nemo_opd.scoring.rendering).
On the driver's thread that work grows with the step's positions; RenderPool moves it into
worker processes (nemo_opd.scoring.render_worker), each holding the rendering and a teacher of
its own (a served teacher's client: its requests go out from the worker, its replies are read
there). One score() call cuts the batch into one contiguous shard of rows per worker; each
worker renders its rows, has its teacher score them, maps the answers and writes them into
files the pool shares with it (in /dev/shm where it has room, else the temporary folder),
which the pool maps as the answer's tensors: the driver ships the conversations and reads a
short reply per worker, and the answers cross no pipe. They are score_rendered's on the driver,
bit for bit (tests/unit/teachers/test_xtok_pool.py).

Every wait has a time-out: a worker that does not report ready within READY_TIMEOUT_S of the
pool's start, or does not answer a job within its time-out (its teacher's own longest wait,
PooledTeacher.longest_wait_s, plus JOB_TIMEOUT_S and SECONDS_PER_POSITION per position of its
rows), is stopped and the pool raises RenderPoolError, one line; so does a worker that dies
(killed for memory, a crash), with the end of its stderr. An exception in a worker's job (a
served teacher's ServedTeacherError, say) is raised again in the driver as itself. After any of
these the pool is closed: the run ends, as it does when the same fault happens on the driver.
Rows whose conversation the teacher's template cannot render are counted in the answers'
counts (XTOK_COUNTS) by the workers as on the driver, so teacher.max_unrendered_share applies
unchanged. close() stops every worker (also when the pool is collected, and when the driver
dies: each worker dies with it).
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from nemo_opd.data.message_log import Message
from nemo_opd.errors import ServiceError
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.scoring.rendering import XTOK_COUNTS, TeacherRendering, rendered_fields
from nemo_opd.scoring.xtok_rows import COUNTS
from nemo_opd.utils.worker_processes import WorkerStarter, worker_environment

READY_TIMEOUT_S = 300.0
"""How long a new worker may take to import its libraries and read the rendering (both
tokenizers, their byte tables and the vocabulary map)."""

JOB_TIMEOUT_S = 300.0
"""A job's time-out besides its teacher's own longest wait and SECONDS_PER_POSITION."""

SECONDS_PER_POSITION = 1e-3
"""A job's time-out per position of its rows (rows x the batch's width): a bound far above
what rendering and mapping cost (docs/cross_tokenizer.md), which scales with the step."""

NETWORK_VARIABLES = (
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)
"""What a worker gets of the driver's environment besides worker_processes.BASE_VARIABLES:
its teacher reaches the server as the driver would (httpx reads these)."""

_STOP_TIMEOUT_S = 5.0
_STDERR_TAIL = 2000
_SHARED_MEMORY = "/dev/shm"
_DTYPES = {torch.float32: "float32", torch.int32: "int32", torch.float64: "float64"}


class RenderPoolError(ServiceError):
    """A render worker died, overran its time-out or could not start; the run's own workers
    and the teacher's server are intact, so the loop saves its last completed step."""


class PooledTeacher(Protocol):
    """What a worker's teacher answers (it is pickled to the worker)."""

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores: ...

    def take_metrics(self) -> dict[str, float]: ...

    def longest_wait_s(self, rows: int) -> float:
        """The most seconds scoring `rows` rows may wait on something outside the worker
        before the teacher gives up with an error of its own (0: it waits on nothing)."""
        ...


@dataclass
class _Worker:
    """One worker process, its teacher, and the job it has in flight (its rows), if any."""

    process: subprocess.Popen
    stderr: object
    teacher: PooledTeacher
    ready: bool = False
    job: tuple[int, int] | None = None
    deadline: float = 0.0
    buffer: bytearray = field(default_factory=bytearray)
    replies: list[dict] = field(default_factory=list)


class RenderPool:
    """Worker processes that render, score and map a teacher's rows (module docstring).

    Args:
        rendering: how the teacher reads the student's conversations.
        teachers: one per worker (a served teacher's client each, its max_concurrency a share
            of the run's: ServedTeacher.split).
        timeout_s: a job's time-out besides its teacher's longest wait; None: JOB_TIMEOUT_S
            plus SECONDS_PER_POSITION per position of its rows.
    """

    def __init__(
        self,
        rendering: TeacherRendering,
        teachers: list[PooledTeacher],
        timeout_s: float | None = None,
    ) -> None:
        if not teachers:
            raise ValueError("a render pool needs at least one worker")
        self.timeout_s = timeout_s
        self._lock = threading.Lock()  # one score() at a time
        self._metrics_lock = threading.Lock()  # taken apart from a score() under way
        self._metrics: dict[str, float] = {}
        self._workers: list[_Worker] = []
        self._folders: dict[str, str] = {}
        self._selector = selectors.DefaultSelector()
        self._starter = WorkerStarter("render-pool-starter")
        self._finalizer = weakref.finalize(
            self, _stop_all, self._workers, self._starter, self._folders
        )
        folder = self._folder(0)
        threads = max(1, _cpus() // len(teachers))
        # removed once every worker has read them (a served teacher's holds its API key)
        self._setup_files = [_dump(rendering, folder, "rendering-")]
        for teacher in teachers:
            self._setup_files.append(_dump(teacher, folder, "teacher-"))
            command = [
                sys.executable,
                "-m",
                "nemo_opd.scoring.render_worker",
                f"--rendering={self._setup_files[0]}",
                f"--teacher={self._setup_files[-1]}",
                f"--parent={os.getpid()}",
                f"--threads={threads}",
            ]
            self._workers.append(self._start(command, teacher))
        self._ready_by = time.monotonic() + READY_TIMEOUT_S

    # ------------------------------------------------------------------------------ scoring

    def score(
        self, batch: Mapping[str, torch.Tensor], logs: list[list[Message]], need: TeacherNeed
    ) -> dict[str, torch.Tensor]:
        """score_rendered's answer for the student's rows `batch` (input_ids and token_mask
        [B, S]) and their conversations: {"topk_logprobs" [B, S, k] fp32, "topk_indices"
        [B, S, k] int32 (with need.topk), "logprobs" [B, S] fp32 (with need.sampled),
        XTOK_COUNTS [B, len(COUNTS)] float64}, each worker's rows scored by its teacher."""
        with self._lock:
            if not self._finalizer.alive:
                raise RenderPoolError("the render pool was closed")
            files: list[str] = []
            try:
                self._wait_ready()
                answer, outputs = self._outputs(batch["input_ids"].shape, need, files)
                self._send(batch, logs, need, outputs, files)
                self._collect()
            except BaseException:
                self.close()
                raise
            finally:
                for path in files:  # the answers' pages stay mapped until freed
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            return answer

    def take_metrics(self) -> dict[str, float]:
        """The workers' teachers' metrics since the last call, summed (a served teacher's
        teacher/server_retries)."""
        with self._metrics_lock:
            metrics, self._metrics = self._metrics, {}
        return metrics

    def _outputs(self, shape: torch.Size, need: TeacherNeed, files: list[str]) -> tuple:
        """The answer's tensors, mapped from new files the workers write into, and what the
        workers are told of them ({name: (path, dtype, shape)})."""
        size, width = shape
        shapes = {}
        if need.topk:
            shapes["topk_logprobs"] = ((size, width, need.topk), torch.float32)
            shapes["topk_indices"] = ((size, width, need.topk), torch.int32)
        if need.sampled:
            shapes["logprobs"] = ((size, width), torch.float32)
        shapes[XTOK_COUNTS] = ((size, len(COUNTS)), torch.float64)
        sizes = {name: _numel(dims) * dtype.itemsize for name, (dims, dtype) in shapes.items()}
        folder = self._folder(sum(sizes.values()))
        answer, outputs = {}, {}
        for name, (dims, dtype) in shapes.items():
            handle, path = tempfile.mkstemp(prefix=f"{name}-", suffix=".bin", dir=folder)
            files.append(path)
            os.ftruncate(handle, sizes[name])
            os.close(handle)
            mapped = torch.from_file(path, shared=True, size=_numel(dims), dtype=dtype)
            answer[name] = mapped.view(dims)
            outputs[name] = (path, _DTYPES[dtype], list(dims))
        return answer, outputs

    def _send(self, batch, logs, need: TeacherNeed, outputs: dict, files: list[str]) -> None:
        """Give each worker its shard of rows: the request in a file, its path on the pipe."""
        size, width = batch["input_ids"].shape
        count = len(self._workers)
        cuts = [size * i // count for i in range(count + 1)]
        for worker, first, end in zip(self._workers, cuts[:-1], cuts[1:], strict=True):
            if first == end:
                continue
            request = {
                "batch": {
                    name: batch[name][first:end].clone() for name in ("input_ids", "token_mask")
                },
                "logs": [[rendered_fields(m) for m in log] for log in logs[first:end]],
                "need": need,
                "first": first,
                "outputs": outputs,
            }
            path = _dump(request, os.path.dirname(files[0]), "request-")
            files.append(path)
            rows = end - first
            limit = self.timeout_s
            if limit is None:
                limit = JOB_TIMEOUT_S + SECONDS_PER_POSITION * rows * width
            worker.job = (first, end)
            worker.deadline = time.monotonic() + limit + worker.teacher.longest_wait_s(rows)
            try:
                worker.process.stdin.write(json.dumps({"request": path}).encode() + b"\n")
                worker.process.stdin.flush()
            except OSError:  # BrokenPipeError: it died since its last job
                raise RenderPoolError(self._died(worker)) from None

    def _collect(self) -> None:
        """Wait for every job's reply; raise what a worker raised, or RenderPoolError."""
        while any(w.job is not None for w in self._workers):
            self._wait()
            for worker in self._workers:
                while worker.replies:
                    self._take(worker, worker.replies.pop(0))

    def _take(self, worker: _Worker, reply: dict) -> None:
        worker.job = None
        if "metrics" in reply:
            with self._metrics_lock:
                for name, value in reply["metrics"].items():
                    self._metrics[name] = self._metrics.get(name, 0.0) + value
            return
        error = _raised(reply)
        if error is not None:
            raise error
        raise RuntimeError(f"a render worker failed: {reply['message']}\n{reply['traceback']}")

    # ------------------------------------------------------------------------------ processes

    def _wait_ready(self) -> None:
        while not all(w.ready for w in self._workers):
            self._wait()
        while self._setup_files:
            with contextlib.suppress(OSError):
                os.unlink(self._setup_files.pop())

    def _wait(self) -> None:
        """Wait for output until the earliest deadline (a job's, or the start's); take lines,
        and raise RenderPoolError for a worker that died or overran."""
        deadlines = [w.deadline for w in self._workers if w.job is not None]
        deadlines += [self._ready_by] * any(not w.ready for w in self._workers)
        if not deadlines:  # nothing to wait for
            return
        for key, _ in self._selector.select(max(0.0, min(deadlines) - time.monotonic())):
            self._read(key.data)
        now = time.monotonic()
        for worker in self._workers:
            if not worker.ready and now >= self._ready_by:
                raise RenderPoolError(
                    f"a render worker of the teacher did not start within "
                    f"{READY_TIMEOUT_S:.0f} s{_stderr_tail(worker)}"
                )
            if worker.job is not None and now >= worker.deadline and not worker.replies:
                worker.process.kill()
                first, end = worker.job
                raise RenderPoolError(
                    f"a render worker of the teacher (pid {worker.process.pid}) did not answer "
                    f"for rows {first}-{end - 1} within its time-out and was stopped (a "
                    "teacher's server that stalls without failing, or a machine too loaded); "
                    "the run's workers are intact: run the same command again to resume from "
                    "the last checkpoint"
                )

    def _read(self, worker: _Worker) -> None:
        """Take what a worker wrote: "ready", replies, or end of file (it died)."""
        chunk = os.read(worker.process.stdout.fileno(), 65536)
        if not chunk:
            raise RenderPoolError(self._died(worker))
        worker.buffer += chunk
        while b"\n" in worker.buffer:
            line, _, rest = worker.buffer.partition(b"\n")
            worker.buffer = bytearray(rest)
            message = json.loads(line)
            if message == "ready":
                worker.ready = True
            else:
                worker.replies.append(message)

    def _died(self, worker: _Worker) -> str:
        """The one line for a worker that died: when, its exit status, its stderr's end."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.process.wait(timeout=_STOP_TIMEOUT_S)
        status = worker.process.poll()
        when = "while starting" if not worker.ready else "between two jobs"
        if worker.job is not None:
            when = f"while scoring rows {worker.job[0]}-{worker.job[1] - 1}"
        killed = ""
        if status == -signal.SIGKILL:
            killed = ", killed: out of memory? fewer teacher.server.render_workers use less"
        return (
            f"a render worker of the teacher (pid {worker.process.pid}) died {when} (exit "
            f"status {status}{killed}){_stderr_tail(worker)}; the run's workers are intact: "
            "run the same command again to resume from the last checkpoint"
        )

    def _start(self, command: list[str], teacher: PooledTeacher) -> _Worker:
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (closed by _stop with the worker)
        process = self._starter.popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=worker_environment(NETWORK_VARIABLES),
            start_new_session=True,
        )
        worker = _Worker(process, stderr, teacher)
        self._selector.register(process.stdout, selectors.EVENT_READ, worker)
        return worker

    def _folder(self, size: int) -> str:
        """This pool's folder for `size` bytes of files: in /dev/shm where it has the room,
        else in the temporary folder (RenderPoolError where neither has)."""
        candidates = [_SHARED_MEMORY] * os.path.isdir(_SHARED_MEMORY) + [tempfile.gettempdir()]
        for base in candidates:
            if _free_bytes(base) >= size:
                if base not in self._folders:
                    self._folders[base] = tempfile.mkdtemp(prefix="nemo_opd-render-", dir=base)
                return self._folders[base]
        raise RenderPoolError(
            f"no room for the teacher's answers of this step ({size / 2**20:.0f} MiB) in "
            f"{' or '.join(candidates)}; free space there or point TMPDIR at a folder that has it"
        )

    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [w.process.pid for w in self._workers]

    def close(self) -> None:
        """Stop every worker and remove the pool's files (safe to call twice)."""
        for worker in self._workers:
            with contextlib.suppress(KeyError, ValueError):
                self._selector.unregister(worker.process.stdout)
        self._finalizer()
        self._selector.close()


def _raised(reply: dict) -> BaseException | None:
    """The exception a worker's job raised, rebuilt from its file (None when it was sent as
    text only)."""
    if reply.get("error") is None:
        return None
    try:
        with open(reply["error"], "rb") as file:
            return pickle.load(file)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(reply["error"])


def _dump(value, folder: str, prefix: str) -> str:
    """Pickle `value` into a new file of `folder`; its path."""
    handle, path = tempfile.mkstemp(prefix=prefix, suffix=".pkl", dir=folder)
    with os.fdopen(handle, "wb") as file:
        pickle.dump(value, file, protocol=5)
    return path


def _numel(dims) -> int:
    out = 1
    for dim in dims:
        out *= dim
    return out


def _free_bytes(folder: str) -> int:
    try:
        stats = os.statvfs(folder)
    except OSError:
        return 0
    return stats.f_bavail * stats.f_frsize


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _stop(worker: _Worker) -> None:
    """Close a worker's stdin and give it _STOP_TIMEOUT_S to exit, then kill it; reap it and
    close its files."""
    process = worker.process
    try:
        process.stdin.close()
        process.wait(timeout=_STOP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if process.poll() is None:
        process.kill()
        process.wait(timeout=_STOP_TIMEOUT_S)
    for stream in (process.stdout, worker.stderr):
        with contextlib.suppress(OSError):
            stream.close()


def _stop_all(workers: list[_Worker], starter: WorkerStarter, folders: dict[str, str]) -> None:
    """Stop every worker of a pool, then the thread that started them, and remove its folders
    (also run when the pool is collected)."""
    while workers:
        _stop(workers.pop())
    starter.close()
    while folders:
        shutil.rmtree(folders.popitem()[1], ignore_errors=True)


def _stderr_tail(worker: _Worker) -> str:
    """ ": <the last line of a worker's stderr>" (a traceback's: the exception), or "" if
    it wrote nothing."""
    worker.stderr.seek(0, os.SEEK_END)
    size = worker.stderr.tell()
    worker.stderr.seek(max(0, size - _STDERR_TAIL))
    lines = worker.stderr.read().decode(errors="replace").strip().splitlines()
    return f": {lines[-1].strip()}" if lines else ""
