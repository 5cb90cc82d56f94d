"""LocalWorkerGroup: a worker group whose workers are objects in this process (no Ray).

Each worker is constructed here, and each call runs in the caller's thread while it holds that
worker's lock: a worker serves one call at a time, as a Ray actor does, so calls from the
loop's threads (main, rollout producer, validation) keep their meaning. Calls to different
workers (the student training while the teacher scores) run at once in their threads.

Every call runs on the process's torch thread count, in whichever thread calls: torch sets a
thread's OpenMP count lazily, at its first parallel op, and vLLM's CPU kernels read that count
before torch has set it (a kernel then refuses a plan made for another count), so each call
sets it first.

Time-outs bound the wait for a worker's lock (another thread's call in progress); a call in
progress in this thread is not interrupted. A worker that raises stays usable (its state is
what its method left); the exception surfaces as WorkerError with the text a Ray worker's
gives. A worker whose constructor or init_distributed raised is dropped with the whole group.

Workers that join a process group (rendezvous) run one rank: they are called one after
another in one thread, so several ranks of one torch.distributed group would wait on each
other forever. Their init_distributed(None) joins the process's one-rank group
(process_group.init_local_process_group), shared by every model of the process.
"""

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from nemo_opd.distributed.worker_calls import (
    DEFAULT_TIMEOUT_S,
    GROUP_TIMEOUT,
    died,
    hung,
    method_name,
    raised,
)

LOCAL_NODE = ("local", "this process")
"""What nodes() answers for each rank: no Ray node, the driver's own process."""


class LocalWorkerGroup:
    """num_workers instances of worker_cls in this process (see the module docstring and
    worker_group.start_workers for the arguments)."""

    def __init__(
        self,
        worker_cls: type,
        num_workers: int,
        make_args: Callable[[int], tuple],
        *,
        name: str = "workers",
        rendezvous: bool = True,
        timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ) -> None:
        if rendezvous and num_workers != 1:
            raise ValueError(
                f"{name}: {num_workers} ranks of one process group cannot run in one process "
                "(their collectives would wait on each other); use the Ray executor"
            )
        self.name = name
        self.worker_cls = worker_cls
        self.timeout_s = timeout_s
        self.workers: list[Any] = []
        for rank in range(num_workers):
            try:
                self.workers.append(worker_cls(*make_args(rank)))
            except Exception as error:
                self.shutdown()
                notice = f"its constructor raised {type(error).__name__}: {error}"
                raise died(name, rank, notice, error) from error
        self._locks = [threading.Lock() for _ in self.workers]
        if rendezvous:
            try:
                self.run(worker_cls.init_distributed, None)
            except BaseException:
                self.shutdown()
                raise

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.workers)

    def wait_until_ready(self) -> None:
        """The workers started in the constructor: nothing to wait for."""

    def run(
        self,
        method: Callable,
        *args: Any,
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args) on the given ranks (default all), one after another; answers
        in rank order."""
        return self.run_each(method, lambda rank: args, ranks, timeout_s)

    def run_each(
        self,
        method: Callable,
        args_of: Callable[[int], tuple],
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args_of(rank)) on the given ranks (default all); answers in rank
        order."""
        name = method_name(self.worker_cls, method)
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        limit = self.timeout_s if timeout_s is GROUP_TIMEOUT else timeout_s
        return [self._call(rank, name, args_of(rank), limit) for rank in ranks]

    def _call(self, rank: int, name: str, args: tuple, timeout_s: float | None) -> Any:
        """One call of rank's worker while holding its lock; WorkerError when it raises or the
        lock stays taken past timeout_s."""
        lock = self._locks[rank]
        if not lock.acquire(timeout=-1 if timeout_s is None else timeout_s):
            raise hung(self.name, [rank], "answer", timeout_s)
        try:
            torch.get_num_threads()  # sets this thread's OpenMP count (module docstring)
            return getattr(self.workers[rank], name)(*args)
        except Exception as error:
            raise raised(self.name, rank, error) from error
        finally:
            lock.release()

    def run_and_put(self, method: Callable, *args: Any) -> list:
        """run(): in one process an answer is already where every group reads it."""
        return self.run(method, *args)

    def put(self, value: Any) -> Any:
        """`value` itself: workers in this process read it where it is."""
        return value

    def nodes(self) -> list[tuple[str, str]]:
        """LOCAL_NODE for each rank."""
        return [LOCAL_NODE] * self.size

    def shutdown(self) -> None:
        """Drop the workers; their memory is freed once nothing else holds them. An engine's
        objects refer to each other, so what frees them is a garbage collection: the caller
        that drops several groups runs one after the last (DistillationRun.shutdown), instead
        of one per group (each walks every object of the process)."""
        self.workers = []
        self._locks = []
