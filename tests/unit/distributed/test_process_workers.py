"""What only the processes executor has to keep (test_worker_groups calls it alike with the
others): its ranks are real processes that join one torch.distributed group; a rank killed
mid-call, or before a call, is named with how it ended, and no call hangs on it; a call that
outlives its time-out is reported and its late answer never answers a later call; a rank that
raises while another still works does not leave the group answering out of turn; one call at
a time per rank across threads (test_worker_groups: no Ray imported)."""

import importlib
import os
import signal
import sys
import threading
import time

import psutil
import pytest
import torch
import torch.distributed as dist

from nemo_opd.distributed.worker_calls import PEER_DEATH_GRACE_S
from nemo_opd.distributed.worker_group import WorkerError, process_env, start_workers
from nemo_opd.errors import SetupError


class Ranked:
    """A rank that joins the group's process group on init_distributed."""

    def __init__(self, rank: int, world: int) -> None:
        self.rank, self.world = rank, world

    def master_address(self) -> tuple[str, int]:
        raise AssertionError("the processes executor picks the address itself")

    def init_distributed(self, address: tuple[str, int]) -> None:
        addr, port = address
        dist.init_process_group(
            "gloo", init_method=f"tcp://{addr}:{port}", rank=self.rank, world_size=self.world
        )

    def all_reduce(self, value: float) -> tuple[float, int, str]:
        tensor = torch.tensor([value])
        dist.all_reduce(tensor)
        return float(tensor), os.getpid(), os.environ["LOCAL_RANK"]

    def pid(self) -> int:
        return os.getpid()

    def sleep(self, seconds: float) -> str:
        time.sleep(seconds)
        return f"slept {seconds}"

    def echo(self, value):
        return value

    def environ(self, *names: str) -> list[str | None]:
        return [os.environ.get(name) for name in names]

    def fail_on(self, rank: int, then_sleep: float) -> int:
        if self.rank == rank:
            raise ValueError(f"rank {rank} refuses")
        time.sleep(then_sleep)
        return self.rank

    def closure(self):
        return lambda: self.rank  # pickle cannot send a lambda

    def exit_now(self, code: int) -> None:
        os._exit(code)


def ranked(world: int, **kwargs):
    return start_workers(
        "processes", Ranked, world, lambda rank: (rank, world), name="ranked", **kwargs
    )


def test_ranks_are_processes_of_one_process_group():
    group = ranked(2)
    try:
        answers = group.run_each(Ranked.all_reduce, lambda rank: (float(rank + 1),))
        assert [value for value, _, _ in answers] == [3.0, 3.0]
        assert [pid for _, pid, _ in answers] == group.pids()
        assert len(set(group.pids()) | {os.getpid()}) == 3
        assert [local for _, _, local in answers] == ["0", "1"]  # rank r takes the r-th device
        assert group.nodes() == [("local", "this machine")] * 2
        if sys.platform.startswith("linux"):  # named after the worker's class, as ps shows
            assert [psutil.Process(pid).name() for pid in group.pids()] == ["Ranked"] * 2
    finally:
        group.shutdown()
    assert all(not alive for alive in _alive(group))


def test_a_rank_that_asks_for_a_gpu_sees_only_its_own(monkeypatch):
    """As Ray gives an actor with num_gpus its device: rank r of a group placed in bundles b
    sees only the b[r]-th of the driver's visible GPUs (its cuda:0), so that several
    single-device engines (vLLM's takes cuda:0 whatever its rank) land on their own GPUs.
    No GPU is touched here: the ranks only report their environment."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b, GPU-c,GPU-d")
    names = ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "VLLM_X")
    options = {"num_gpus": 0.5, "runtime_env": {"env_vars": {"VLLM_X": "1"}}}
    group = ranked(2, rendezvous=False, ray_options=lambda rank: options, bundles=[3, 1])
    try:
        assert group.run(Ranked.environ, *names) == [["GPU-d", "0", "1"], ["GPU-b", "0", "1"]]
    finally:
        group.shutdown()
    cpu = ranked(2, rendezvous=False, ray_options=lambda rank: {"num_gpus": 0}, bundles=[3, 1])
    try:  # no GPU asked for: the fork server's visibility, rank r as its local rank
        answers = cpu.run(Ranked.environ, *names)
        assert [local for _, local, _ in answers] == ["0", "1"]
        assert not {visible for visible, _, _ in answers} & {"GPU-d", "GPU-b"}
    finally:
        cpu.shutdown()


def test_the_gpu_a_rank_gets_is_named_by_its_bundle():
    options = {"num_gpus": 1, "runtime_env": {"env_vars": {"A": "b"}}}
    assert process_env(options, 2, None) == {
        "A": "b",
        "CUDA_VISIBLE_DEVICES": "2",
        "LOCAL_RANK": "0",
    }
    assert process_env(options, 1, "4,6")["CUDA_VISIBLE_DEVICES"] == "6"
    assert process_env({"num_gpus": 0}, 1, "4,6") == {}
    with pytest.raises(SetupError, match=r"needs GPU 2 .* CUDA_VISIBLE_DEVICES='4,6' makes 2"):
        process_env(options, 2, "4,6")
    with pytest.raises(SetupError, match="makes 0 visible"):
        process_env(options, 0, "")


def _alive(group) -> list[bool]:
    return [handle.process.is_alive() for handle in getattr(group, "_ranks", [])]


def test_a_rank_killed_mid_call_is_named_and_the_group_stays_refused():
    group = ranked(2)
    try:
        victim = group.pids()[1]
        killer = threading.Timer(0.5, os.kill, (victim, signal.SIGKILL))
        killer.start()
        started = time.monotonic()
        with pytest.raises(WorkerError) as caught:
            group.run(Ranked.sleep, 5.0)
        assert time.monotonic() - started < 4.5  # not after rank 0's answer
        assert str(caught.value).startswith(
            f"ranked: worker rank 1 died (pid {victim}: killed by SIGKILL); the other ranks"
        )
        assert (caught.value.rank, caught.value.died) == (1, True)
        with pytest.raises(WorkerError, match=r"rank 1 died \(pid \d+: killed by SIGKILL\)"):
            group.run(Ranked.pid, ranks=[1])
        # rank 0 finishes its sleep, then serves the next call
        assert group.run(Ranked.echo, "still here", ranks=[0], timeout_s=120) == ["still here"]
    finally:
        group.shutdown()


def test_a_rank_that_exits_is_named_with_its_code():
    group = ranked(1, rendezvous=False)
    try:
        with pytest.raises(WorkerError, match=r"rank 0 died \(pid \d+: exited with code 3\)"):
            group.run(Ranked.exit_now, 3)
    finally:
        group.shutdown()


def test_a_late_answer_never_answers_a_later_call():
    group = ranked(1, rendezvous=False)
    try:
        with pytest.raises(WorkerError, match=r"ranked: ranks \[0\] did not answer in 0.3 s"):
            group.run(Ranked.sleep, 1.0, timeout_s=0.3)
        # The rank finishes the first call, then answers this one: only this one's answer.
        assert group.run(Ranked.echo, "second") == ["second"]
    finally:
        group.shutdown()


def test_a_rank_that_raises_while_another_works_leaves_the_group_in_turn():
    group = ranked(2)
    try:
        started = time.monotonic()
        with pytest.raises(WorkerError, match="ranked: worker rank 0 raised ValueError: rank 0"):
            group.run(Ranked.fail_on, 0, PEER_DEATH_GRACE_S + 2.0)
        # in completion order, not rank by rank: once no death of the working rank followed
        # the raise within the grace, not when that rank answers
        assert time.monotonic() - started < PEER_DEATH_GRACE_S + 1.5
        assert group.run_each(Ranked.echo, lambda rank: (rank * 10,)) == [0, 10]
    finally:
        group.shutdown()


def test_one_call_at_a_time_per_rank_across_threads():
    group = ranked(1, rendezvous=False)
    try:
        answers = []
        held = threading.Thread(target=lambda: answers.append(group.run(Ranked.sleep, 2.0)))
        held.start()
        time.sleep(0.3)
        with pytest.raises(WorkerError, match=r"ranked: ranks \[0\] did not answer in 0.2 s"):
            group.run(Ranked.echo, 1, timeout_s=0.2)  # the other thread's call holds the rank
        held.join(timeout=60)
        assert answers == [["slept 2.0"]]
        assert group.run(Ranked.echo, 2) == [2]
    finally:
        group.shutdown()


def test_an_answer_that_cannot_be_sent_is_an_error_not_a_hang():
    group = ranked(1, rendezvous=False)
    try:
        with pytest.raises(WorkerError, match="raised TypeError: the answer cannot be sent back"):
            group.run(Ranked.closure)
        assert group.run(Ranked.echo, "next") == ["next"]
    finally:
        group.shutdown()


def test_every_module_the_fork_server_imports_exists():
    # The fork server passes over a module it cannot import without a word: a name gone stale
    # (a module of transformers or of the package renamed) would cost every rank its import
    # again. Each backend's entry is the module its engine is defined in.
    from nemo_opd.distributed.process_workers import PRELOAD
    from nemo_opd.policy.engines import ENGINE_MODULES
    from nemo_opd.policy.engines.dtensor import DTensorEngine
    from nemo_opd.policy.engines.megatron import MegatronEngine

    for name in [*PRELOAD, *ENGINE_MODULES.values()]:
        importlib.import_module(name)
    engines = {"dtensor": DTensorEngine, "megatron": MegatronEngine}
    assert {backend: cls.__module__ for backend, cls in engines.items()} == ENGINE_MODULES
