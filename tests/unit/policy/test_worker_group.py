"""RayWorkerGroup started in the background (wait=False): the constructor returns while the
ranks start, every rank joins at rank 0's address, and a rank that fails to start is reported
by wait_until_ready() with the group shut down."""

import sys
import time

import pytest
import ray
import ray.cloudpickle

from nemo_opd.distributed.cluster import WorkerResources
from nemo_opd.distributed.worker_group import WorkerError, start_workers

# The actor classes below live in this test module, which Ray's workers cannot import.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])

START_S = 1.5


class SlowStarter:
    """Takes START_S to "build its engine"; rank `fail` raises instead."""

    def __init__(self, rank: int, fail: int | None = None) -> None:
        self.rank, self.fail, self.joined = rank, fail, None

    def master_address(self) -> tuple[str, int]:
        return "10.0.0.1", 4242 + self.rank

    def init_distributed(self, address: tuple[str, int]) -> None:
        time.sleep(START_S)
        if self.rank == self.fail:
            raise RuntimeError("engine build failed")
        self.joined = tuple(address)

    def joined_at(self) -> tuple[str, int] | None:
        return self.joined


def slow_group(worker_cls: type, workers: int, make_args, name: str):
    """A Ray group of `workers` ranks started in the background, one CPU each."""
    return start_workers(
        "ray",
        worker_cls,
        workers,
        make_args,
        name=name,
        wait=False,
        reserve=WorkerResources("cpu", 1),
    )


def test_starts_in_the_background_and_joins_rank_0(ray_session):
    launched = time.perf_counter()
    group = slow_group(SlowStarter, 2, lambda rank: (rank,), "slow")
    returned = time.perf_counter() - launched
    try:
        assert returned < START_S  # the ranks are still starting
        group.wait_until_ready()
        assert time.perf_counter() - launched >= START_S
        joined = group.run(SlowStarter.joined_at)
        assert joined == [("10.0.0.1", 4242), ("10.0.0.1", 4242)]
        group.wait_until_ready()  # a second call returns at once
    finally:
        group.shutdown()


def test_a_rank_that_fails_to_start_is_named_and_the_group_shut_down(ray_session):
    group = slow_group(SlowStarter, 2, lambda rank: (rank, 1), "slow")
    with pytest.raises(WorkerError, match="slow: worker rank 1 raised RuntimeError: engine build"):
        group.wait_until_ready()
    assert group.actors == []


class BrokenConstructor(SlowStarter):
    def __init__(self, rank: int) -> None:
        raise ValueError(f"rank {rank} has no model")


def test_a_constructor_that_raises_is_named_with_its_exception(ray_session):
    group = slow_group(BrokenConstructor, 1, lambda rank: (rank,), "broken")
    with pytest.raises(WorkerError) as caught:
        group.wait_until_ready()
    assert str(caught.value).startswith(
        "broken: worker rank 0 died (its constructor raised ValueError: rank 0 has no model)"
    )
