"""Which Ray a run uses: cluster.address, else RAY_ADDRESS, else a local instance it starts and
stops (without idle worker processes, started again after Ray's start-up time-out); an address
where no head answers is refused at once, without connecting."""

import subprocess
import sys
import time

import psutil
import pytest
import ray

from nemo_opd.config import ClusterConfig
from nemo_opd.distributed.ray_runtime import ADDRESS_ENV, cluster_address, init_ray, ray_session
from nemo_opd.errors import SetupError

pytestmark = pytest.mark.usefixtures("own_ray")  # Ray's start and stop, no other instance


def test_the_config_comes_before_the_environment(monkeypatch):
    monkeypatch.setenv(ADDRESS_ENV, "10.0.0.2:6379")
    assert cluster_address(ClusterConfig(address="10.0.0.1:6379")) == (
        "10.0.0.1:6379",
        "cluster.address",
    )
    assert cluster_address(ClusterConfig()) == ("10.0.0.2:6379", ADDRESS_ENV)
    monkeypatch.setenv(ADDRESS_ENV, "")
    assert cluster_address(ClusterConfig()) == (None, ADDRESS_ENV)
    monkeypatch.delenv(ADDRESS_ENV)
    assert cluster_address(ClusterConfig()) == (None, ADDRESS_ENV)


def test_an_address_from_the_environment_that_does_not_answer(monkeypatch, unused_port):
    monkeypatch.setenv(ADDRESS_ENV, unused_port)
    started = time.monotonic()
    with pytest.raises(
        SetupError, match=rf"^RAY_ADDRESS: cannot reach a Ray head at {unused_port}"
    ):
        init_ray(ClusterConfig())
    assert time.monotonic() - started < 5.0
    assert not ray.is_initialized()


def test_a_dashboard_address_in_the_environment_is_named(monkeypatch):
    monkeypatch.setenv(ADDRESS_ENV, "http://127.0.0.1:8265")
    with pytest.raises(SetupError, match="RAY_ADDRESS: http://127.0.0.1:8265 is a dashboard"):
        init_ray(ClusterConfig())


def idle_workers() -> list[psutil.Process]:
    """Ray's idle worker processes among this process's descendants (its local instance's)."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if " ".join(child.cmdline()).startswith("ray::IDLE"):
                found.append(child)
        except psutil.Error:  # ended meanwhile
            pass
    return found


TIMED_OUT = (
    "The current node timed out during startup. This could happen because some of the raylet "
    "failed to startup or the GCS has become overloaded."
)
"""Ray's error for a node whose raylet did not register within its 30 s (ray._private.node)."""


def timing_out_starts(monkeypatch, count: int) -> list[subprocess.Popen]:
    """ray.init's first `count` calls each start a process (as a start's GCS would be) and then
    fail as Ray does when its node times out; later calls are Ray's own. The processes."""
    real_init, started = ray.init, []

    def init(*args, **kwargs):
        if len(started) < count:
            started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"]))
            raise Exception(TIMED_OUT)  # noqa: TRY002 - what Ray raises
        return real_init(*args, **kwargs)

    monkeypatch.setattr(ray, "init", init)
    return started


def test_a_local_instance_ends_with_the_session_and_one_inside_it_leaves_it(monkeypatch, capsys):
    """The session's own local instance, with no idle worker processes, stops at its end; a
    session opened inside it (a caller already connected, as the command line is inside
    `ray job submit`) neither looks at its config nor disconnects the caller. Its first start
    timed out here (as on a busy machine): what it left is stopped and it is started again."""
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    failed = timing_out_starts(monkeypatch, count=1)
    with ray_session(ClusterConfig(device="cpu")):
        assert len(failed) == 1 and failed[0].poll() is not None  # killed, waited for
        assert ray.is_initialized()
        gcs = ray.get_runtime_context().gcs_address
        # No idle worker processes (Ray's default starts one per CPU for the first driver
        # within a second or two of its start; a run's workers are actors of their own).
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:
            assert idle_workers() == []
            time.sleep(0.2)
        with ray_session(ClusterConfig(address="10.0.0.1:6379")):  # not even looked at
            pass
        assert ray.is_initialized()
        assert ray.get_runtime_context().gcs_address == gcs
    out = capsys.readouterr().out
    assert "ray: the local instance timed out during start-up; starting it again" in out
    assert f"ray: started a local instance at {gcs}" in out
    assert not ray.is_initialized()


def test_a_local_instance_that_never_starts_in_time_is_one_clear_error(monkeypatch):
    monkeypatch.delenv(ADDRESS_ENV, raising=False)
    failed = timing_out_starts(monkeypatch, count=2)
    with pytest.raises(SetupError, match=r"^Ray's local instance did not start: .* 2 times") as err:
        init_ray(ClusterConfig(device="cpu"))
    assert "too busy" in str(err.value) and "cluster.address=auto" in str(err.value)
    assert len(failed) == 2 and all(process.poll() is not None for process in failed)
    assert not ray.is_initialized()


@pytest.fixture
def unused_port():
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"127.0.0.1:{port}"
