"""The Ray instance of a run: an existing cluster when one is given, else a local instance
sized for the config's workers.

    init_ray(cfg.cluster)             # True: this call connected this process to Ray
    with ray_session(cfg.cluster):    # the same, disconnected again at the end if it connected
        ...

Which one (cluster_address): cluster.address, else the RAY_ADDRESS environment variable (which
`ray job submit` sets for the job it starts), else none: a local instance starts, as on a
laptop. Attaching to a cluster only connects this process as a driver; ray.shutdown() at the
end disconnects it and leaves the cluster running. A local instance ends with the run.

The command line (nemo_opd.cli) starts Ray before it imports the training loop, while a thread
imports torch and transformers, so that Ray's own start-up (its GCS, raylet and agents, each
a process) overlaps the driver's heaviest imports instead of following them
(docs/benchmarks.md, "Where the embedded default's time goes", has the figures).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress

import psutil
import ray
from ray.exceptions import AuthenticationError

from nemo_opd.config import ClusterConfig
from nemo_opd.distributed.address import probe_head
from nemo_opd.errors import SetupError

ADDRESS_ENV = "RAY_ADDRESS"
LOCAL_START_ATTEMPTS = 2
"""How often a local instance is started before its time-out is reported (start_local_instance)."""
_START_TIMED_OUT = "timed out during startup"
"""What Ray's error says when a new node's raylet did not register in time."""
CONNECT_TIMEOUT_S = 10.0
"""How long the cluster's head may take to answer before setup reports it unreachable."""
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""Ray settings of a local instance. Ray starts one idle worker process per CPU for the first
driver, for the tasks it expects; a run has no tasks on its own node (its workers are actors,
each started in a process of its own), so those would only take CPU time from the driver's
imports while Ray starts (docs/benchmarks.md)."""


def local_cpus(cluster: ClusterConfig) -> int:
    """CPUs a local Ray instance offers: this machine's, or what the workers reserve if more."""
    return max(os.cpu_count() or 1, cluster.world_size * cluster.cpus_per_worker)


def cluster_address(cluster: ClusterConfig) -> tuple[str | None, str]:
    """(address of the cluster to attach to, or None for a local instance; where it came from:
    "cluster.address" or "RAY_ADDRESS")."""
    if cluster.address:
        return cluster.address, "cluster.address"
    return os.environ.get(ADDRESS_ENV) or None, ADDRESS_ENV


def init_ray(cluster: ClusterConfig) -> bool:
    """Connect this process to Ray unless it is already: to the cluster at cluster_address,
    or to a new local instance. Returns whether this call connected it. An address where no
    Ray head answers raises SetupError within CONNECT_TIMEOUT_S."""
    if ray.is_initialized():
        return False
    address, source = cluster_address(cluster)
    if address is None:
        # "local": never a cluster that `ray start` left on this machine (Ray's default for
        # address=None), which would also refuse num_cpus.
        gcs = start_local_instance(local_cpus(cluster))
        print(f"ray: started a local instance at {gcs}")
        return True
    if address != "auto":  # "auto": the cluster `ray start` started on this node
        probe_head(address, CONNECT_TIMEOUT_S, source)
    _attach(address, source)
    return True


def start_local_instance(num_cpus: int, *, log_to_driver: bool = True) -> str:
    """ray.init of a new local instance of `num_cpus` logical CPUs, with no dashboard; its GCS
    address. Ray gives the new node's raylet a fixed 30 s to register with its GCS
    (ray._private.node), which a machine busy with other work can miss: the processes that
    start left are then stopped and the start tried again (LOCAL_START_ATTEMPTS in all), and
    SetupError says what to do if every try times out. Ray's other errors are raised as they
    are."""
    for attempt in range(1, LOCAL_START_ATTEMPTS + 1):
        before = {child.pid for child in psutil.Process().children(recursive=True)}
        try:
            context = ray.init(
                address="local",
                num_cpus=num_cpus,
                include_dashboard=False,
                log_to_driver=log_to_driver,
                _system_config=LOCAL_SYSTEM_CONFIG,
            )
            return context.address_info["gcs_address"]
        except Exception as error:  # Ray raises a bare Exception for this one
            if _START_TIMED_OUT not in str(error):
                raise
        _stop_new_children(before)
        if attempt < LOCAL_START_ATTEMPTS:
            print("ray: the local instance timed out during start-up; starting it again")
    raise SetupError(
        f"Ray's local instance did not start: its node timed out during start-up "
        f"{LOCAL_START_ATTEMPTS} times (Ray waits 30 s for it). The machine is likely too busy "
        "(other runs or builds on its cores): run again when it is less busy, or start Ray "
        "yourself (`ray start --head`) and set cluster.address=auto"
    )


def _stop_new_children(before: set[int]) -> None:
    """Kill this process's descendants whose pids are not in `before` (a failed start's GCS,
    raylet and agents: Ray lost its handle on them with the error) and wait for them."""
    started = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
    for child in started:
        with suppress(psutil.Error):
            child.kill()
    psutil.wait_procs(started, timeout=10)


def _attach(address: str, source: str) -> None:
    """ray.init as a driver of the cluster at `address`; Ray's own failure as SetupError."""
    try:
        with _ray_address(address):  # Ray prefers RAY_ADDRESS to its address argument
            ray.init(address=address, log_to_driver=True)
    except (ConnectionError, RuntimeError, ValueError, AuthenticationError) as error:
        raise SetupError(
            f"{source}: cannot attach to the Ray cluster at {address}: {error}. The loop must "
            "run on a node of that cluster (`ray start --address` ran there), or be submitted "
            "with `ray job submit`; a cluster with token authentication (the default of "
            "`ray start --head` in Ray 2.60) also needs RAY_AUTH_MODE=token and its token "
            "(RAY_AUTH_TOKEN or ~/.ray/auth_token) in this process's environment "
            "(docs/cluster.md)"
        ) from None
    nodes = sum(1 for node in ray.nodes() if node["Alive"])
    print(f"ray: attached to the cluster at {address} ({nodes} nodes alive)")


@contextmanager
def _ray_address(address: str) -> Iterator[None]:
    """RAY_ADDRESS set to `address` for the block, then restored."""
    previous = os.environ.get(ADDRESS_ENV)
    os.environ[ADDRESS_ENV] = address
    try:
        yield
    finally:
        if previous is None:
            del os.environ[ADDRESS_ENV]
        else:
            os.environ[ADDRESS_ENV] = previous


@contextmanager
def ray_session(cluster: ClusterConfig) -> Iterator[None]:
    """init_ray for the block; at its end (however it ends) this process disconnects if the
    block connected it: a local instance stops, an attached cluster keeps running. Already
    connected (the caller's own ray.init), it stays connected."""
    connected = init_ray(cluster)
    try:
        yield
    finally:
        if connected:
            ray.shutdown()
