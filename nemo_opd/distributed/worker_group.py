"""Worker groups: one worker object per rank, called from the driver, answers in rank order.

    group = start_workers("local", PolicyWorker, 1, lambda rank: (rank, ...), name="policy")
    group.run(PolicyWorker.save, path)                               # every rank, same arguments
    group.run_each(PolicyWorker.train, lambda rank: (shards[rank], loss_ref, 32))  # per rank
    handle = group.run_and_put(PolicyWorker.full_weights)[0]      # for another group to read
    group.shutdown()

Three executors implement the one WorkerGroup interface, and the callers (Policy,
VllmGeneration, the teachers through Policy, the loop) never ask which:
- "ray" (ray_workers.RayWorkerGroup): each worker is a Ray actor, a process of its own, placed
  in a placement-group bundle; the ranks of a model join a torch.distributed group over TCP.
  For more than one worker, several nodes, a cluster.
- "local" (local_workers.LocalWorkerGroup): each worker is an object in this process, and a call
  runs in the caller's thread under that worker's lock: like an actor, a worker serves one call
  at a time (the loop calls workers from its main thread, the rollout producer's thread and the
  validation thread). One rank per model, in the process's one-rank torch.distributed group.
  Ray is never imported.
- "processes" (process_workers.ProcessWorkerGroup): each worker is a child process of this
  machine, forked from a server that imported the engines once; the ranks of a model join a
  torch.distributed group over TCP here, as under Ray. Several ranks on one machine without
  Ray, and a start that costs a fork instead of a fresh interpreter's imports.

A method is named by its function (PolicyWorker.train, EngineWorker.generate), never by a
string: a misspelt method fails at import and grep finds every call. Each implementation
resolves it on its workers by that function's name, so a worker class that implements a
Protocol serves the calls made through the Protocol's functions.

Arguments a worker receives may be values or what group.put returned (Ray: an ObjectRef in the
object store, resolved by Ray before the call; local and processes: the object itself).

Failures: a worker that raises, dies or does not answer within the group's time-out raises
WorkerError naming the group and the rank, in the same words under every executor. A worker
that raised stays in the group and serves the next call, as a Ray actor outlives an exception
of its own; a group whose start failed is shut down.
"""

import os
from collections.abc import Callable, Sequence
from typing import Any, Literal, Protocol

from nemo_opd.distributed.worker_calls import (
    DEFAULT_TIMEOUT_S,
    GROUP_TIMEOUT,
    WorkerError,
)
from nemo_opd.errors import SetupError

__all__ = ["DEFAULT_TIMEOUT_S", "GROUP_TIMEOUT", "Executor", "WorkerError", "WorkerGroup"]

Executor = Literal["ray", "local", "processes"]
CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"


class WorkerGroup(Protocol):
    """Workers of one class, one per rank (see the module docstring)."""

    name: str

    @property
    def size(self) -> int:
        """Ranks in the group."""
        ...

    def wait_until_ready(self) -> None:
        """Block until every rank has started (built what its init builds, joined its
        process group); a rank that failed raises WorkerError, after the group is shut down.
        Returns at once when already done."""
        ...

    def run(
        self,
        method: Callable,
        *args: Any,
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args) on the given ranks (default all); answers in rank order.
        timeout_s: this call's limit (default the group's)."""
        ...

    def run_each(
        self,
        method: Callable,
        args_of: Callable[[int], tuple],
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args_of(rank)) on the given ranks (default all); answers in rank
        order."""
        ...

    def run_and_put(self, method: Callable, *args: Any) -> list:
        """method(worker, *args) on every rank, each answer kept where the workers of another
        group read it without a copy through the driver (Ray: put into the object store by the
        worker; local: the object itself): one handle per rank, None where a rank answered
        None. A handle is passed to another group's call as an argument."""
        ...

    def put(self, value: Any) -> Any:
        """A handle on `value` for calls of any group: sent once, however many ranks read it
        (Ray: an ObjectRef; local: `value` itself)."""
        ...

    def nodes(self) -> list[tuple[str, str]]:
        """(node id, node address) of each rank."""
        ...

    def shutdown(self) -> None:
        """Stop every worker and release what the group reserved (idempotent)."""
        ...


def start_workers(
    executor: Executor,
    worker_cls: type,
    num_workers: int,
    make_args: Callable[[int], tuple],
    *,
    name: str,
    rendezvous: bool = True,
    wait: bool = True,
    timeout_s: float | None = DEFAULT_TIMEOUT_S,
    start_timeout_s: float | None = DEFAULT_TIMEOUT_S,
    ray_options: Callable[[int], dict] | None = None,
    placement: Any = None,
    bundles: Sequence[int] | None = None,
    reserve: Any = None,
    preload: Sequence[str] = (),
) -> WorkerGroup:
    """num_workers workers `worker_cls(*make_args(rank))` on `executor`.

    Args:
        rendezvous: the ranks join a torch.distributed group: each worker provides
            master_address() -> (addr, port) and init_distributed(address), where the address
            is rank 0's (the processes executor gives 127.0.0.1 and a free port of this
            machine), or None for the one rank of a group in this process.
        wait: block until every rank has started; with False they start in the background
            and wait_until_ready() blocks, so that several groups start at once (Ray and
            processes; local
            workers start in this call, and a failure raises here).
        timeout_s: how long a call may take (None: no limit).
        start_timeout_s: how long the start may take.
        ray_options, placement, bundles, reserve: where Ray puts each worker (RayWorkerGroup);
            ignored by the local executor. A process of the processes executor is given the
            environment variables of ray_options' runtime_env, and, where ray_options ask for
            a GPU, the one Ray would give it: the bundles[rank]-th (default rank-th) of the
            driver's visible GPUs, as its only one (process_env).
        preload: modules the workers will import, which the processes executor's fork server
            imports once for all its ranks where it starts now (start_fork_server); the other
            executors ignore it.
    """
    if executor == "local":
        from nemo_opd.distributed.local_workers import LocalWorkerGroup

        return LocalWorkerGroup(
            worker_cls,
            num_workers,
            make_args,
            name=name,
            rendezvous=rendezvous,
            timeout_s=timeout_s,
        )
    if executor == "processes":
        from nemo_opd.distributed.process_workers import ProcessWorkerGroup

        return ProcessWorkerGroup(
            worker_cls,
            num_workers,
            make_args,
            name=name,
            rendezvous=rendezvous,
            wait=wait,
            timeout_s=timeout_s,
            start_timeout_s=start_timeout_s,
            preload=preload,
            environ=lambda rank: process_env(
                ray_options(rank) if ray_options else {},
                device=rank if bundles is None else bundles[rank],
                visible=os.environ.get(CUDA_VISIBLE_DEVICES),
            ),
        )
    if executor != "ray":
        raise ValueError(f"executor must be 'ray', 'local' or 'processes', got {executor!r}")
    from nemo_opd.distributed.ray_workers import RayWorkerGroup  # imports Ray

    return RayWorkerGroup(
        worker_cls,
        num_workers,
        make_args,
        name=name,
        rendezvous=rendezvous,
        wait=wait,
        timeout_s=timeout_s,
        start_timeout_s=start_timeout_s,
        options=ray_options,
        placement=placement,
        bundles=bundles,
        reserve=reserve,
    )


def process_env(options: dict, device: int, visible: str | None) -> dict[str, str]:
    """The environment of a processes-executor worker whose Ray options are `options`: their
    runtime_env's env_vars, and, where they ask for a GPU (num_gpus > 0), the device Ray would
    give the actor as its only one: CUDA_VISIBLE_DEVICES the `device`-th entry of `visible`
    (the driver's CUDA_VISIBLE_DEVICES; None: every GPU of the machine, so the device itself),
    with LOCAL_RANK 0 (that device is the process's cuda:0). Without it every rank would see
    every GPU, and vLLM's single-device engine takes cuda:0 whatever its rank: all of a run's
    engines on one GPU. SetupError when `visible` lists no `device`-th GPU."""
    env = dict(options.get("runtime_env", {}).get("env_vars", {}))
    if options.get("num_gpus", 0) > 0:
        env[CUDA_VISIBLE_DEVICES] = _visible_device(device, visible)
        env["LOCAL_RANK"] = "0"
    return env


def _visible_device(device: int, visible: str | None) -> str:
    """The `device`-th GPU of a CUDA_VISIBLE_DEVICES value (indices or UUIDs)."""
    if visible is None:
        return str(device)
    devices = [entry.strip() for entry in visible.split(",") if entry.strip()]
    if device >= len(devices):
        raise SetupError(
            f"a worker needs GPU {device} of this machine's visible GPUs, but "
            f"CUDA_VISIBLE_DEVICES={visible!r} makes {len(devices)} visible: set "
            f"cluster.gpus_per_node to at most {len(devices)}, or make more GPUs visible"
        )
    return devices[device]
