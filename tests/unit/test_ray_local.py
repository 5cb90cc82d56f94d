"""tests/ray_local.py, the local Ray instance that the test modules of one process share: a
module that leaves an actor or a placement group behind is named in a warning and the next
module gets a fresh instance, while a clean one leaves the instance to the next; the sizes a
module asks for; and the instance ends when it is stopped, idle, or its process ends."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import ray
import ray_local
from ray.util.placement_group import placement_group
from ray_local import SharedRayLeftovers, shared_ray, stop_shared_ray

from nemo_opd.distributed.address import probe_head
from nemo_opd.errors import SetupError

TESTS = Path(__file__).resolve().parents[1]


@ray.remote(num_cpus=0)
class Idle:
    def ping(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def no_instance():
    """Each test starts with no shared instance and leaves none."""
    stop_shared_ray()
    yield
    stop_shared_ray()


def stopped(address: str, within_s: float = 60.0) -> bool:
    """Whether the GCS at `address` stops answering within `within_s`."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            probe_head(address, timeout_s=5.0)
        except SetupError:
            return True
        time.sleep(0.5)
    return False


def test_a_clean_module_leaves_the_instance_to_the_next_until_it_is_idle(recwarn, monkeypatch):
    with shared_ray(2, user="test_first") as first:
        actor = Idle.options(num_cpus=1).remote()
        assert ray.get(actor.ping.remote())
        ray.kill(actor)  # stopped by the module: released within SETTLE_S
    assert not ray.is_initialized()  # between modules: nothing connected
    with shared_ray(2, user="test_second") as second:
        assert ray.cluster_resources()["CPU"] == ray_local.SHARED_CPUS
        assert ray_local.leftovers(settle_s=0) == []
        monkeypatch.setattr(ray_local, "IDLE_STOP_S", 0.5)  # from the last module's end
    assert second == first
    assert not [w for w in recwarn if issubclass(w.category, SharedRayLeftovers)]
    assert stopped(second)


def test_what_a_module_leaves_is_named_and_the_next_gets_a_fresh_instance(monkeypatch):
    """An actor and a placement group left by one module: both named in its warning."""
    monkeypatch.setattr(ray_local, "SETTLE_S", 1.0)
    named = r"1 live actor\(s\) \(Idle\); 1 placement group\(s\); 2 of 4 CPU in use"
    message = rf"^test_leaky left on the shared Ray instance: {named}; it is stopped"
    with (
        pytest.warns(SharedRayLeftovers, match=message),
        shared_ray(2, user="test_leaky") as first,
    ):
        held = Idle.options(num_cpus=1).remote()
        assert ray.get(held.ping.remote())
        ray.get(placement_group([{"CPU": 1}]).ready(), timeout=60)
    assert stopped(first, within_s=5.0)
    with shared_ray(2, user="test_next") as second:
        assert ray_local.leftovers(settle_s=0) == []
    assert second != first


def test_sizes_at_least_or_exactly_what_a_module_asks_for():
    with shared_ray(6) as larger:
        assert ray.cluster_resources()["CPU"] == 6
    with shared_ray(2) as at_least_two:  # 6 is at least 2: the same instance
        assert ray.cluster_resources()["CPU"] == 6
    with shared_ray(2, exact=True) as exact:  # 6 is not exactly 2: a fresh instance
        assert ray.cluster_resources()["CPU"] == 2
    with shared_ray(1) as at_least_one:  # 2 is at least 1: the same instance
        assert ray.cluster_resources()["CPU"] == 2
    assert larger == at_least_two != exact == at_least_one


def test_a_module_that_starts_its_own_ray_finds_the_shared_one_stopped():
    """A process connected to a Ray of its own (here: the shared instance's, by its address,
    as a module that attaches to a running one) cannot use the shared instance; stopped, the
    instance no longer answers (a module's own ray.init would start a fresh one)."""
    with shared_ray(2) as address:
        pass
    ray.init(address=address, log_to_driver=False)
    try:
        with (
            pytest.raises(RuntimeError, match="already connected to Ray"),
            shared_ray(2, user="test_inside"),
        ):
            pass
    finally:
        ray.shutdown()
    stop_shared_ray()
    assert stopped(address, within_s=5.0)


def test_the_instance_ends_with_its_process():
    code = textwrap.dedent(
        """
        import os, sys
        sys.path.insert(0, sys.argv[1])
        from ray_local import shared_ray
        with shared_ray(1) as address:
            print(address, flush=True)
            os._exit(0)  # no teardown at all, as a killed test process
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(TESTS)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert stopped(done.stdout.strip())
