"""The worker-group executors, called alike: Ray actors, objects in this process and processes
forked on this machine answer the same calls with the same answers, in rank order, and name a
raising worker in the same words; a worker that raised serves the next call. Then what only the
local executor has to keep (one call at a time per worker across threads), and no Ray imported
by a group of either executor without it (test_process_workers has the processes executor's
own)."""

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch
from ray_local import shared_ray

from nemo_opd.distributed.worker_group import WorkerError, start_workers

EXECUTORS = ["ray", "local", "processes"]


class Tally:
    """A worker with state: rank r starts at 10 * r."""

    def __init__(self, rank: int, scale: int = 1) -> None:
        self.rank, self.scale, self.total = rank, scale, 10 * rank

    def add(self, amount: int) -> int:
        self.total += amount * self.scale
        return self.total

    def rank_and(self, value) -> tuple[int, object]:
        return self.rank, value

    def weights(self) -> dict[str, torch.Tensor] | None:
        return {"w": torch.full((3,), float(self.rank + 1))} if self.rank == 0 else None

    def read_sum(self, weights: dict[str, torch.Tensor]) -> float:
        return float(weights["w"].sum())

    def fail(self, why: str) -> None:
        raise ValueError(why)

    def die_after_peer_raises(self, delay_s: float) -> None:
        """Rank 1 raises at once (as a peer of a killed rank in a collective does, with a
        connection reset); rank 0 is killed `delay_s` later."""
        if self.rank == 1:
            raise ConnectionResetError("peer closed the connection")
        time.sleep(delay_s)
        os.kill(os.getpid(), signal.SIGKILL)


class Broken(Tally):
    def __init__(self, rank: int) -> None:
        raise ValueError(f"rank {rank} has no model")


@pytest.fixture(scope="module")
def ray_started():
    """Ray for the "ray" cases: this process connected to the instance the process's modules
    share (tests/ray_local.py) on first use, disconnected at the end of the module."""
    started = []

    with contextlib.ExitStack() as connected:

        def start() -> None:
            import ray.cloudpickle

            if not started:
                # The worker classes live in this test module, which Ray's workers cannot import.
                ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
                connected.enter_context(shared_ray(2, user=__name__))
                started.append(True)

        yield start


def group_of(executor: str, worker_cls: type, workers: int, ray_started):
    """A group of `workers` ranks of worker_cls(rank) on `executor` (Ray actors reserve no
    CPU)."""
    if executor == "ray":
        ray_started()
    return start_workers(
        executor,
        worker_cls,
        workers,
        lambda rank: (rank,),
        name="tally",
        rendezvous=False,
        ray_options=lambda rank: {"num_cpus": 0},
    )


@pytest.fixture(scope="module")
def tallies(ray_started):
    """executor -> a group of 2 Tally ranks on it, started on first use and shared by the
    tests that leave it as it was (usable, each rank's total whatever it is)."""
    started = {}

    def get(executor: str):
        if executor not in started:
            started[executor] = group_of(executor, Tally, 2, ray_started)
        return started[executor]

    yield get
    for group in started.values():
        group.shutdown()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_same_calls_same_answers_in_rank_order(executor, ray_started):
    group = group_of(executor, Tally, 2, ray_started)
    try:
        group.wait_until_ready()
        assert group.size == 2
        assert group.run(Tally.add, 1) == [1, 11]
        assert group.run(Tally.add, 2, ranks=[1]) == [13]
        assert group.run_each(Tally.rank_and, lambda rank: (f"r{rank}",)) == [(0, "r0"), (1, "r1")]
        assert group.run_each(Tally.rank_and, lambda rank: (rank * 2,), ranks=[1, 0]) == [
            (1, 2),
            (0, 0),
        ]
        shared = group.put({"a": [1, 2]})
        assert group.run(Tally.rank_and, shared) == [(0, {"a": [1, 2]}), (1, {"a": [1, 2]})]
        handles = group.run_and_put(Tally.weights)
        assert handles[1] is None
        # A handle goes to another call (another group's, in the loop) as the value itself.
        assert group.run(Tally.read_sum, handles[0]) == [3.0, 3.0]
        assert len(group.nodes()) == 2
    finally:
        group.shutdown()
    group.shutdown()  # idempotent


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_raising_worker_is_named_alike_and_serves_the_next_call(executor, tallies):
    group = tallies(executor)
    totals = group.run(Tally.add, 0)
    with pytest.raises(WorkerError) as caught:
        group.run(Tally.fail, "no such batch", ranks=[1])
    assert str(caught.value) == "tally: worker rank 1 raised ValueError: no such batch"
    assert (caught.value.rank, caught.value.died) == (1, False)
    assert isinstance(caught.value.cause, ValueError)
    # state as it was, the group usable
    assert group.run(Tally.add, 1) == [total + 1 for total in totals]


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_constructor_that_raises_is_named_alike(executor, ray_started):
    with pytest.raises(WorkerError) as caught:
        group = group_of(executor, Broken, 1, ray_started)
        group.wait_until_ready()  # Ray starts in the background; local raised above
    assert str(caught.value).startswith(
        "tally: worker rank 0 died (its constructor raised ValueError: rank 0 has no model)"
    )


@pytest.mark.parametrize("executor", ["ray", "processes"])
def test_a_death_behind_a_peers_raise_is_what_is_named(executor, ray_started):
    """A rank killed in a collective makes its peers raise first; the error names the death
    (the cause), reported within PEER_DEATH_GRACE_S of the raise, with the raise as context."""
    group = group_of(executor, Tally, 2, ray_started)
    try:
        group.wait_until_ready()
        with pytest.raises(WorkerError) as caught:
            group.run(Tally.die_after_peer_raises, 0.5)
        assert str(caught.value).startswith("tally: worker rank 0 died (pid ")
        assert (caught.value.rank, caught.value.died) == (0, True)
        assert "ConnectionResetError" in str(caught.value.__cause__)
    finally:
        group.shutdown()


@pytest.mark.parametrize("executor", EXECUTORS)
def test_a_method_is_named_by_a_function_of_the_class(executor, tallies):
    group = tallies(executor)
    with pytest.raises(TypeError, match="not 'add'"):
        group.run("add", 1)
    with pytest.raises(TypeError, match="Tally has no method _ping"):
        group.run(_ping)


def _ping(worker) -> None:
    """A function no worker class has."""


class Gate(Tally):
    """`hold` stays inside the worker until the test sets `release`."""

    def __init__(self, rank: int) -> None:
        super().__init__(rank)
        self.entered, self.release = threading.Event(), threading.Event()

    def hold(self) -> str:
        self.entered.set()
        self.release.wait(timeout=60)
        return "held"


def test_local_worker_serves_one_call_at_a_time_across_threads():
    group = start_workers("local", Gate, 1, lambda rank: (rank,), name="gate", rendezvous=False)
    worker = group.workers[0]
    answers = []
    held = threading.Thread(target=lambda: answers.append(group.run(Gate.hold)))
    held.start()
    assert worker.entered.wait(timeout=60)
    with pytest.raises(WorkerError, match=r"gate: ranks \[0\] did not answer in 0.05 s"):
        group.run(Gate.add, 1, timeout_s=0.05)  # the other thread's call holds the worker
    assert worker.total == 0  # so it never ran
    worker.release.set()
    held.join(timeout=60)
    assert answers == [["held"]]
    assert group.run(Gate.add, 1) == [1]  # free again


def test_local_group_of_several_ranks_that_rendezvous_is_refused():
    with pytest.raises(ValueError, match="2 ranks of one process group cannot run in one"):
        start_workers("local", Tally, 2, lambda rank: (rank,), name="policy")


def test_a_group_without_ray_never_imports_it():
    """The loop's modules, then a group of each executor without Ray (one interpreter for both:
    its start is most of the test), and Ray is still not imported after each."""
    code = (
        "import sys\n"
        "from nemo_opd.distributed.worker_group import start_workers\n"
        "from nemo_opd.policy.policy import Policy\n"
        "from nemo_opd.generation import VllmGeneration\n"
        "import nemo_opd.algorithms.distillation, nemo_opd.cli, nemo_opd.evaluate\n"
        "if __name__ == '__main__':\n"  # each rank of processes imports this module again
        "    for executor in ('local', 'processes'):\n"
        "        group = start_workers(executor, dict, 1, lambda rank: (), name='d',\n"
        "                              rendezvous=False)\n"
        "        assert group.run(dict.copy) == [{}]\n"
        "        group.shutdown()\n"
        "        print(executor, 'ray' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=600
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["local", "False", "processes", "False"]
