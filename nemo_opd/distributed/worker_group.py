"""A group of Ray actors, one per rank, with a torch.distributed process group between them.

The driver calls every worker with a function of (actor, rank) that returns an ObjectRef, so
each call site names the actor method it means (no dispatch by method-name strings). Results
come back in rank order; a worker that dies or raises surfaces as an error naming its rank.
"""

import re
from collections.abc import Callable, Sequence
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_opd.distributed.cluster import WorkerResources, build_placement_group
from nemo_opd.distributed.nodes import actor_nodes
from nemo_opd.errors import RunError


class WorkerError(RunError):
    """A worker died or raised; the message names the group, the rank and what happened (the
    worker's own traceback is the exception's __cause__)."""


class WorkerGroup:
    """`num_workers` instances of `actor_cls`, one per placement-group bundle.

    Args:
        actor_cls: a plain class; it is wrapped with ray.remote here. Its constructor gets
            (rank, *make_args(rank)); it must provide `master_address() -> (addr, port)` and
            `init_distributed((addr, port))`.
        num_workers: ranks in the group.
        resources: what each worker reserves.
        make_args: constructor arguments (after the rank) of each rank.
        name: shown in error messages.
        timeout_s: how long any call may take before it is reported as hung.
        placement: an existing placement group with a bundle per rank, shared with other groups
            (colocated student, teacher and generation); None reserves a group of its own.
        share: the fraction of each bundle's CPUs and GPU this group's actors take when the
            placement is shared.
        wait: block until every rank has joined the process group; with False the ranks start
            in the background (the rendezvous chained through Ray, no driver round trip) and
            wait_until_ready() blocks, so several groups and the driver's own setup overlap.
    """

    def __init__(
        self,
        actor_cls: type,
        num_workers: int,
        resources: WorkerResources,
        make_args: Callable[[int], tuple],
        name: str = "workers",
        timeout_s: float | None = 1800.0,
        placement: PlacementGroup | None = None,
        share: float = 1.0,
        wait: bool = True,
    ) -> None:
        self.name = name
        self.timeout_s = timeout_s
        self.owns_placement = placement is None
        self.placement_group = placement or build_placement_group(num_workers, resources)
        remote_cls = ray.remote(actor_cls)
        self.actors = [
            remote_cls.options(
                num_cpus=resources.cpus * share,
                num_gpus=share if resources.device_type == "cuda" else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    self.placement_group, placement_group_bundle_index=rank
                ),
            ).remote(rank, *make_args(rank))
            for rank in range(num_workers)
        ]
        # Every rank's init_distributed takes rank 0's address as an ObjectRef: Ray runs it once
        # rank 0 has answered, and the driver is free meanwhile.
        address = self.actors[0].master_address.remote()
        self._starting = [actor.init_distributed.remote(address) for actor in self.actors]
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> None:
        """Block until every rank has joined the process group and built what its
        init_distributed builds; a rank that failed raises WorkerError, after the whole group
        is shut down. Returns at once when already done."""
        if not self._starting:
            return
        try:
            starting = "start (build the engine, join the process group)"
            self.get(self._starting, list(range(self.size)), starting)
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
        self, call: Callable[[Any, int], ray.ObjectRef], ranks: Sequence[int] | None = None
    ) -> list:
        """Call `call(actor, rank)` on the given ranks (default: all); results in rank order."""
        ranks = list(range(self.size)) if ranks is None else list(ranks)
        refs = [call(self.actors[rank], rank) for rank in ranks]
        return self.get(refs, ranks)

    def get(
        self, refs: Sequence[ray.ObjectRef], ranks: Sequence[int], what: str = "answer"
    ) -> list:
        """Wait for every ref; the first failure (in completion order) raises WorkerError, and
        so does a rank that does not `what` within timeout_s. Each result is fetched
        (deserialized) once, as it completes."""
        rank_of = {ref: rank for ref, rank in zip(refs, ranks, strict=True)}
        results = {}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=self.timeout_s)
            if not done:
                stuck = sorted(rank_of[ref] for ref in pending)
                message = f"ranks {stuck} did not {what} in {self.timeout_s} s"
                raise WorkerError(f"{self.name}: {message}")
            results[done[0]] = self._result(done[0], rank_of[done[0]])
        return [results[ref] for ref in refs]

    def _result(self, ref: ray.ObjectRef, rank: int) -> Any:
        """The value of a finished ref; a dead or failing worker raises WorkerError."""
        try:
            return ray.get(ref)
        except RayActorError as error:
            raise WorkerError(
                f"{self.name}: worker rank {rank} died ({death_notice(error)}); the other "
                "ranks of the group cannot continue"
            ) from error
        except RayTaskError as error:
            cause = getattr(error, "cause", None)
            what = f"{type(cause).__name__}: {cause}" if cause is not None else str(error)
            raise WorkerError(f"{self.name}: worker rank {rank} raised {what}") from error

    def shutdown(self) -> None:
        """Kill every actor and release the placement group."""
        for actor in self.actors:
            ray.kill(actor)
        self.actors = []
        self._starting = []
        if self.owns_placement:
            ray.util.remove_placement_group(self.placement_group)


def death_notice(error: RayActorError) -> str:
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
