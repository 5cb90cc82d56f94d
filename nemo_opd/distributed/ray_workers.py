"""RayWorkerGroup: a worker group whose workers are Ray actors, one process per rank.

The driver calls every actor at once and gathers the answers in rank order as they complete;
a worker that dies or raises surfaces as WorkerError naming its rank (worker_group). The ranks
of a rendezvous group join a torch.distributed group at rank 0's address, passed from actor to
actor by Ray (the driver is free meanwhile).
"""

import re
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import OutOfMemoryError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_opd.distributed.cluster import WorkerResources, build_placement_group
from nemo_opd.distributed.nodes import actor_nodes
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

STARTING = "start (build the engine, join the process group)"


class RayWorkerGroup:
    """`num_workers` Ray actors of `worker_cls` (worker_group.start_workers has the arguments).

    Args:
        options: each rank's Ray actor options (num_cpus, num_gpus, runtime_env); default
            none.
        placement: a placement group shared with other groups (colocated student, teacher and
            generation); rank r runs in its bundle bundles[r] (default r).
        reserve: without `placement`, what each rank reserves in a placement group of this
            group's own (released at shutdown); with neither, Ray places the actors.
    """

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
        options: Callable[[int], dict] | None = None,
        placement: PlacementGroup | None = None,
        bundles: Sequence[int] | None = None,
        reserve: WorkerResources | None = None,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError(
                f"{name}: Ray workers need a Ray session (call ray.init() first), or run them in "
                "this process (the local executor)"
            )
        self.name = name
        self.worker_cls = worker_cls
        self.timeout_s = timeout_s
        self.start_timeout_s = start_timeout_s
        self.owns_placement = placement is None and reserve is not None
        if self.owns_placement:
            placement = build_placement_group(num_workers, reserve)
        self.placement_group = placement
        bundles = list(range(num_workers)) if bundles is None else list(bundles)
        remote_cls = ray.remote(worker_cls)
        self.actors = [
            remote_cls.options(
                **(options(rank) if options else {}), **_in_bundle(placement, bundles[rank])
            ).remote(*make_args(rank))
            for rank in range(num_workers)
        ]
        if rendezvous:
            # Every rank's init_distributed takes rank 0's address as an ObjectRef: Ray runs it
            # once rank 0 has answered, and the driver is free meanwhile.
            address = self.actors[0].master_address.remote()
            self._starting = [actor.init_distributed.remote(address) for actor in self.actors]
        else:
            self._starting = [actor.__ray_ready__.remote() for actor in self.actors]
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> None:
        """Block until every rank has started; a rank that failed raises WorkerError, after the
        whole group is shut down. Returns at once when already done."""
        if not self._starting:
            return
        try:
            ranks = list(range(self.size))
            self.get(self._starting, ranks, STARTING, self.start_timeout_s)
        except BaseException:
            self.shutdown()
            raise
        self._starting = []

    def nodes(self) -> list[tuple[str, str]]:
        """(node id, node address) of each rank, as Ray placed them."""
        return actor_nodes(self.actors)

    @property
    def size(self) -> int:
        """Ranks in the group."""
        return len(self.actors)

    def run(
        self,
        method: Callable,
        *args: Any,
        ranks: Sequence[int] | None = None,
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """method(worker, *args) on the given ranks (default all); answers in rank order."""
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
        refs = [getattr(self.actors[rank], name).remote(*args_of(rank)) for rank in ranks]
        limit = self.timeout_s if timeout_s is GROUP_TIMEOUT else timeout_s
        return self.get(refs, ranks, timeout_s=limit)

    def run_and_put(self, method: Callable, *args: Any) -> list:
        """method(worker, *args) on every rank, each answer put into the object store by its
        worker: an ObjectRef per rank (None where it answered None)."""
        name = method_name(self.worker_cls, method)
        ranks = list(range(self.size))
        refs = [actor.__ray_call__.remote(_put_answer, name, *args) for actor in self.actors]
        answers = self.get(refs, ranks, timeout_s=self.timeout_s)
        return [None if answer is None else answer[0] for answer in answers]

    def put(self, value: Any) -> ray.ObjectRef:
        """`value` in Ray's object store (once, however many actors read it)."""
        return ray.put(value)

    def get(
        self,
        refs: Sequence[ray.ObjectRef],
        ranks: Sequence[int],
        what: str = "answer",
        timeout_s: float | None = GROUP_TIMEOUT,
    ) -> list:
        """Wait for every ref; the first failure (in completion order) raises WorkerError, and
        so does a rank that does not `what` within timeout_s (default the group's). Each result
        is fetched (deserialized) once, as it completes."""
        limit = self.timeout_s if timeout_s is GROUP_TIMEOUT else timeout_s
        rank_of = {ref: rank for ref, rank in zip(refs, ranks, strict=True)}
        results = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=limit)
            if not done:
                raise hung(self.name, [rank_of[ref] for ref in pending], what, limit)
            try:
                results[done[0]] = self._result(done[0], rank_of[done[0]])
            except WorkerError as error:
                death = None if error.died else self._death_behind(pending, rank_of)
                if death is None:
                    raise
                raise death from error  # the peer's raise, kept for the traceback
        return [results[ref] for ref in refs]

    def _death_behind(
        self, pending: list[ray.ObjectRef], rank_of: dict[ray.ObjectRef, int]
    ) -> WorkerError | None:
        """After a rank raised: the death of a rank still `pending`, reported within
        PEER_DEATH_GRACE_S, or None (a rank killed in a collective makes its peers raise
        first; its death is what the user must read)."""
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=PEER_DEATH_GRACE_S)
        for ref in done:
            try:
                self._result(ref, rank_of[ref])
            except WorkerError as error:
                if error.died:
                    return error
        return None

    def _result(self, ref: ray.ObjectRef, rank: int) -> Any:
        """The value of a finished ref; a dead or failing worker raises WorkerError."""
        try:
            return ray.get(ref)
        except (RayActorError, OutOfMemoryError) as error:
            raise died(self.name, rank, death_notice(error), error) from error
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            if cause is None:
                raise raised(self.name, rank, error) from error
            raise raised(self.name, rank, cause) from error

    def shutdown(self) -> None:
        """Kill every actor and release the placement group if the group reserved it."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        self._starting = []
        if self.owns_placement:
            ray.util.remove_placement_group(self.placement_group)
            self.owns_placement = False


def _in_bundle(placement: PlacementGroup | None, index: int) -> dict:
    """The scheduling option that puts an actor into bundle `index` of a placement group."""
    if placement is None:
        return {}
    strategy = PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=index)
    return {"scheduling_strategy": strategy}


def _put_answer(worker: Any, name: str, *args: Any) -> list[ray.ObjectRef] | None:
    """Inside an actor: its method `name` called, the answer put into the object store and its
    ref returned wrapped in a list (so that Ray hands the caller the ref, not the value)."""
    answer = getattr(worker, name)(*args)
    return None if answer is None else [ray.put(answer)]


def death_notice(error: Exception) -> str:
    """'pid N: <Ray's exit detail>' from an actor's death notice, as far as it says; for an
    actor whose constructor raised, that exception's last line."""
    text = str(error)
    if getattr(error, "_actor_init_failed", False):
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        return f"its constructor raised {lines[-1]}"
    pid = re.search(r"\bpid[:=] ?(\d+)", text)
    detail = re.search(r"Worker exit detail: ([^.]+)\.", text)
    how = detail.group(1) if detail else type(error).__name__
    return f"pid {pid.group(1)}: {how}" if pid else how
