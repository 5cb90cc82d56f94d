"""ProcessWorkerGroup: a worker group whose workers are processes of this machine (no Ray).

Each rank is a child process forked from a fork server (the standard library's forkserver
start method) that has imported the engines' modules once (PRELOAD): a rank starts without
importing torch, transformers and the engines again, the several seconds of CPU that a fresh
Ray actor spends on them. Ranks of one model join a torch.distributed group over TCP on this
machine (127.0.0.1, a free port) as Ray's do; rank r runs with LOCAL_RANK=r, so that on CUDA it
takes the r-th visible GPU (process_group.init_distributed), and with the environment variables
its Ray options would give a Ray actor (worker_group.start_workers: a rank that asks for a GPU
is given its own, as the only one it sees, with LOCAL_RANK 0). A rank started while a run
keeps its workers' start-up output in logger.log_dir's workers.log (utils.worker_output) writes
its standard error there for its whole life.

Each rank's process is named after its worker class (Linux: PR_SET_NAME, what ps, top and
psutil show as the process's name: "PolicyWorker", "VllmWorker"), as Ray names an actor's
process "ray::<class>".

A call is pickled by value to each rank over a pipe and answered the same way (Ray copies
arguments and answers too). A reader thread per rank receives the answers, so that a rank
answering while the driver sends never blocks either side; each call has an id, and an answer
of a call the driver stopped waiting for (it raised on another rank first, or timed out) is
dropped when it comes. A rank whose process ends (killed, out of memory) is reported by its
reader: the call waiting on it, and every later one, raises WorkerError naming it, with the
process's exit code or signal; a rank that raises while a peer dies (a connection reset in a
collective) yields to that death (worker_calls.PEER_DEATH_GRACE_S). Time-outs bound every
wait, start included. A rank serves one call at a time, as a Ray actor does; calls from several
driver threads take each rank's lock.

Worker classes and the arguments of their calls must be importable by name in the child (the
fork server re-creates the driver's sys.path), as under Ray without pickling by value.
"""

import ctypes
import itertools
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import pickle
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from nemo_opd.distributed.worker_calls import (
    DEFAULT_TIMEOUT_S,
    GROUP_TIMEOUT,
    PEER_DEATH_GRACE_S,
    WorkerError,
    died,
    hung,
    method_name,
    raised,
)
from nemo_opd.utils.worker_output import WORKERS_LOG_ENV

PRELOAD = [
    "torch",
    "transformers",
    "transformers.modeling_utils",
    "transformers.modeling_layers",
    "nemo_opd.policy.worker",
    "nemo_opd.policy.engines.dtensor",
]
"""What the fork server imports before it forks a rank: what every policy rank imports.
transformers' modeling_utils and modeling_layers are what building any model imports
(transformers loads them on first use, with the image and audio modules they pull in; what a
rank spent on them again is measured in docs/distillation.md)."""
PROCESS_NODE = ("local", "this machine")
"""What nodes() answers for each rank: no Ray node, a process of the driver's machine."""
STARTING = "start (build the worker, join the process group)"
_READY = "__ready__"
_PR_SET_NAME = 15
_NAME_BYTES = 15  # the kernel keeps 16 bytes of a process's name, its NUL included
_context = multiprocessing.get_context("forkserver")


def start_fork_server(preload: Sequence[str] = ()) -> None:
    """Start this process's fork server now, if it is not running: its imports (PRELOAD and
    `preload`, some seconds of CPU) then run beside whatever this process does next, instead of
    when the first group forks its first rank (which waits for them). The command line calls it
    before it imports the loop; a group started later finds the server running, with what it
    imported then (a module it lacks, each rank imports for itself).

    Args:
        preload: modules the ranks import besides PRELOAD (the Megatron engine's).
    """
    _context.set_forkserver_preload(list(dict.fromkeys([*PRELOAD, *preload])))
    multiprocessing.forkserver.ensure_running()


class ProcessWorkerGroup:
    """`num_workers` child processes, each serving one `worker_cls` object (see the module
    docstring and worker_group.start_workers for the arguments)."""

    def __init__(
        self,
        worker_cls: type,
        num_workers: int,
        make_args: Callable[[int], tuple],
        *,
        name: str = "workers",
        rendezvous: bool = True,
        wait: bool = True,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
        start_timeout_s: float | None = DEFAULT_TIMEOUT_S,
        environ: Callable[[int], dict[str, str]] | None = None,
        preload: Sequence[str] = (),
    ) -> None:
        start_fork_server(preload)  # at once if it runs (the command line starts it early)
        self.name = name
        self.worker_cls = worker_cls
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self._ids = itertools.count(1)
        self._waiting: dict[int, tuple[queue.SimpleQueue, set[int]]] = {}  # id -> answers, ranks
        self._waiting_lock = threading.Lock()
        self._dead: dict[int, str] = {}  # rank -> how its process ended
        self._locks = [threading.Lock() for _ in range(num_workers)]
        self._ranks: list[_Rank] = []
        try:
            log = os.environ.get(WORKERS_LOG_ENV)  # utils.worker_output: a run's workers.log
            for rank in range(num_workers):
                env = {"LOCAL_RANK": str(rank), **(environ(rank) if environ else {})}
                env.update({WORKERS_LOG_ENV: log} if log else {})
                self._ranks.append(self._start_rank(rank, make_args(rank), env))
        except BaseException:
            self.shutdown()
            raise
        self._start_error: BaseException | None = None
        self._starter = threading.Thread(
            target=self._finish_start, args=(rendezvous,), name=f"{name}-start", daemon=True
        )
        self._starter.start()
        if wait:
            self.wait_until_ready()

    # ------------------------------------------------------------------ start and stop

    def _start_rank(self, rank: int, args: tuple, env: dict[str, str]) -> "_Rank":
        """Fork rank's process (with `env` added to its environment, it builds
        worker_cls(*args) and answers _READY) and start the thread that reads its answers."""
        driver_end, child_end = _context.Pipe(duplex=True)
        process = _context.Process(
            target=_serve,
            args=(child_end, self.worker_cls, args, env),
            name=f"{self.name}-rank{rank}",
            daemon=True,
        )
        process.start()
        child_end.close()
        handle = _Rank(rank, process, driver_end)
        reader = threading.Thread(
            target=self._read_answers, args=(handle,), name=f"{self.name}-reader{rank}", daemon=True
        )
        reader.start()
        return handle

    def _finish_start(self, rendezvous: bool) -> None:
        """Wait for every rank's worker, then join their process group (in the background when
        the group was started with wait=False)."""
        try:
            ranks = list(range(self.size))
            self._gather(ranks, _READY, lambda rank: (), STARTING, self.start_timeout_s)
            if rendezvous:
                from nemo_opd.distributed.process_group import find_free_port

                address = ("127.0.0.1", find_free_port())
                init = method_name(self.worker_cls, self.worker_cls.init_distributed)
                self._gather(ranks, init, lambda rank: (address,), STARTING, self.start_timeout_s)
        except BaseException as error:
            self._start_error = error

    def wait_until_ready(self) -> None:
        """Block until every rank has started; a rank that failed raises WorkerError, after the
        whole group is shut down. Returns at once when already done."""
        self._starter.join()
        if self._start_error is not None:
            error, self._start_error = self._start_error, None
            self.shutdown()
            raise error

    def shutdown(self) -> None:
        """Ask every rank to exit, then end the ones that do not within a few seconds
        (idempotent)."""
        ranks, self._ranks = self._ranks, []
        for handle in ranks:
            handle.stop()
        deadline = time.monotonic() + 5.0
        for handle in ranks:
            handle.process.join(timeout=max(0.0, deadline - time.monotonic()))
            if handle.process.is_alive():
                handle.process.kill()
                handle.process.join(timeout=5.0)
            handle.connection.close()

    # ------------------------------------------------------------------ calls

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self._ranks)

    def run(
        self,
        method: Callable,
        *args: Any,
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args) on the given ranks (default all), all at once; answers in rank
        order."""
        return self.run_each(method, lambda rank: args, ranks, timeout_s)

    def run_each(
        self,
        method: Callable,
        args_of: Callable[[int], tuple],
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args_of(rank)) on the given ranks (default all), all at once;
        answers in rank order."""
        name = method_name(self.worker_cls, method)
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        limit = self.timeout_s if timeout_s is GROUP_TIMEOUT else timeout_s
        self.wait_until_ready()
        deadline = None if limit is None else time.monotonic() + limit
        taken = []
        try:
            for rank in sorted(set(ranks)):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._locks[rank].acquire(timeout=-1 if left is None else left):
                    raise hung(self.name, [rank], "answer", limit)
                taken.append(rank)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            return self._gather(ranks, name, args_of, "answer", left, reported_limit=limit)
        finally:
            for rank in taken:
                self._locks[rank].release()

    def run_and_put(self, method: Callable, *args: Any) -> list:
        """run(): each answer comes back to this process, and a call of another group that
        reads it sends it on (a copy through the driver, which Ray's object store avoids)."""
        return self.run(method, *args)

    def put(self, value: Any) -> Any:
        """`value` itself: it is pickled into each call that passes it."""
        return value

    def nodes(self) -> list[tuple[str, str]]:
        """PROCESS_NODE for each rank."""
        return [PROCESS_NODE] * self.size

    def pids(self) -> list[int]:
        """Each rank's process id."""
        return [handle.process.pid for handle in self._ranks]

    def _gather(
        self,
        ranks: Sequence[int],
        name: str,
        args_of: Callable[[int], tuple],
        what: str,
        timeout_s: float | None,
        reported_limit: float | None = None,
    ) -> list:
        """Send call `name` to each rank and wait for their answers, in completion order; the
        first failure raises WorkerError, and so do ranks that do not answer in timeout_s."""
        call_id = next(self._ids)
        answers: queue.SimpleQueue = queue.SimpleQueue()
        with self._waiting_lock:
            self._waiting[call_id] = (answers, set(ranks))
        try:
            for rank in ranks:
                self._send(rank, call_id, name, args_of(rank), answers)
            results: dict[int, Any] = {}
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while len(results) < len(set(ranks)):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    rank, status, payload = answers.get(timeout=left)
                except queue.Empty:
                    pending = [r for r in ranks if r not in results]
                    limit = timeout_s if reported_limit is None else reported_limit
                    raise hung(self.name, pending, what, limit) from None
                try:
                    results[rank] = self._result(rank, status, payload)
                except WorkerError as error:
                    death = None if error.died else self._death_behind(results, ranks, answers)
                    if death is None:
                        raise
                    raise death from error  # the peer's raise, kept for the traceback
            return [results[rank] for rank in ranks]
        finally:
            with self._waiting_lock:
                self._waiting.pop(call_id, None)

    def _death_behind(
        self, results: dict[int, Any], ranks: Sequence[int], answers: queue.SimpleQueue
    ) -> WorkerError | None:
        """After a rank raised: the death of another rank of the call reported within
        PEER_DEATH_GRACE_S, or None. A rank killed in a collective makes its peers raise (a
        connection reset) before its reader reports it, and the death is what the user must
        read."""
        waiting = len(set(ranks)) - len(results) - 1
        deadline = time.monotonic() + PEER_DEATH_GRACE_S
        while waiting and (left := deadline - time.monotonic()) > 0:
            try:
                rank, status, payload = answers.get(timeout=left)
            except queue.Empty:
                return None
            if status == "died":
                return died(self.name, rank, payload)
            waiting -= 1
        return None

    def _send(self, rank: int, call_id: int, name: str, args: tuple, answers) -> None:
        """Send one call to rank; a rank already gone answers at once as died."""
        handle = self._ranks[rank]
        if rank in self._dead:
            answers.put((rank, "died", self._dead[rank]))
            return
        message = pickle.dumps((call_id, name, args), protocol=pickle.HIGHEST_PROTOCOL)
        try:
            with handle.send_lock:
                handle.connection.send_bytes(message)
        except OSError:
            answers.put((rank, "died", self._death_notice(handle)))

    def _result(self, rank: int, status: str, payload: Any) -> Any:
        """The answer of one rank, or its failure as WorkerError."""
        if status == "ok":
            return pickle.loads(payload)
        if status == "died":
            raise died(self.name, rank, payload)
        error = _exception(payload)
        if status == "start_failed":
            notice = f"its constructor raised {type(error).__name__}: {error}"
            raise died(self.name, rank, notice, error) from error
        raise raised(self.name, rank, error) from error

    def _read_answers(self, handle: "_Rank") -> None:
        """The reader thread of one rank: each answer to the call waiting for it; when the
        process ends, every call waiting on this rank is told how."""
        while True:
            try:
                call_id, status, payload = pickle.loads(handle.connection.recv_bytes())
            except (EOFError, OSError):
                break
            with self._waiting_lock:
                answers, _ = self._waiting.get(call_id, (None, None))
            if answers is not None:
                answers.put((handle.rank, status, payload))
        if handle.stopping:
            return
        notice = self._death_notice(handle)
        self._dead[handle.rank] = notice
        with self._waiting_lock:
            waiting = [answers for answers, ranks in self._waiting.values() if handle.rank in ranks]
        for answers in waiting:
            answers.put((handle.rank, "died", notice))

    def _death_notice(self, handle: "_Rank") -> str:
        """'pid N: killed by SIGKILL' / 'pid N: exited with code 3'."""
        handle.process.join(timeout=5.0)
        code = handle.process.exitcode
        if code is None:
            how = "its connection closed"
        elif code < 0:
            how = f"killed by {signal.Signals(-code).name}"
        else:
            how = f"exited with code {code}"
        return f"pid {handle.process.pid}: {how}"


def _exception(payload: bytes) -> BaseException:
    """A rank's exception as it sent it: (its pickle or None, its type's name, its text)."""
    pickled, type_name, text = pickle.loads(payload)
    if pickled is not None:
        try:
            return pickle.loads(pickled)
        except Exception:  # a class this process cannot build from its pickle
            pass
    return RuntimeError(f"{type_name}: {text}")


class _Rank:
    """One rank's process, the driver's end of its pipe, and whether the driver stopped it."""

    def __init__(self, rank: int, process, connection) -> None:
        self.rank, self.process, self.connection = rank, process, connection
        self.send_lock = threading.Lock()
        self.stopping = False

    def stop(self) -> None:
        """Ask the process to exit (a None message); a closed pipe means it already has."""
        self.stopping = True
        try:
            with self.send_lock:
                self.connection.send_bytes(pickle.dumps(None))
        except OSError:
            pass


# ---------------------------------------------------------------------- in the child


def adopt_environ(environ: dict[str, str]) -> None:
    """Set `environ` in this process, forked from the fork server: OMP_NUM_THREADS sets torch's
    thread count too (the server imported torch before the variable was there)."""
    os.environ.update(environ)
    if "OMP_NUM_THREADS" in environ:
        import torch

        torch.set_num_threads(int(environ["OMP_NUM_THREADS"]))


def _serve(connection, worker_cls: type, args: tuple, environ: dict[str, str]) -> None:
    """A rank's process: build the worker, answer _READY, then serve calls until a None
    message or the driver's end of the pipe closes."""
    adopt_environ(environ)
    _name_process(worker_cls.__name__)
    if WORKERS_LOG_ENV in environ:  # standard error to the run's workers.log, for good
        log = os.open(environ[WORKERS_LOG_ENV], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(log, 2)
        os.close(log)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the driver's to handle
    try:
        worker = worker_cls(*args)
    except BaseException as error:
        worker = None
        start_error = error
    while True:
        try:
            message = pickle.loads(connection.recv_bytes())
        except (EOFError, OSError):
            return
        if message is None:
            return
        call_id, name, call_args = message
        if name == _READY:
            if worker is None:
                _answer(connection, call_id, "start_failed", start_error)
                return
            _answer(connection, call_id, "ok", None)
            continue
        try:
            answer = getattr(worker, name)(*call_args)
        except BaseException as error:
            _answer(connection, call_id, "raised", error)
            continue
        _answer(connection, call_id, "ok", answer)


def _name_process(name: str) -> None:
    """Give this process `name` (its first 15 bytes) where the kernel shows it: ps, top,
    /proc/PID/comm (Linux; elsewhere the fork server's name stays)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_NAME, name.encode()[:_NAME_BYTES], 0, 0, 0)


def _answer(connection, call_id: int, status: str, value: Any) -> None:
    """Send one answer. An exception goes as (its pickle, its type's name, its text), the
    pickle None where it cannot be pickled; an answer that cannot be pickled is sent as the
    TypeError that says so."""
    if status == "ok":
        try:
            payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as error:
            status, value = "raised", TypeError(f"the answer cannot be sent back: {error}")
    if status != "ok":
        payload = pickle.dumps((_pickled(value), type(value).__name__, str(value)))
    connection.send_bytes(pickle.dumps((call_id, status, payload), protocol=5))


def _pickled(error: BaseException) -> bytes | None:
    try:
        return pickle.dumps(error, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:
        return None
