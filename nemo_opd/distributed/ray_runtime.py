"""The Ray instance of a run: a local one sized for the config's workers, unless one is running.

    init_ray(cfg.cluster)             # True: this call started Ray
    with ray_session(cfg.cluster):    # the same, stopped again at the end if it started it
        ...

The command line (nemo_opd.cli) starts Ray before it imports the training loop, while a thread
imports torch and transformers, so that Ray's own start-up (its GCS, raylet and agents: ~8 s of
other processes on a 2-core CPU) overlaps the driver's heaviest imports instead of following
them (docs/benchmarks.md, "Where the embedded default's time goes").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from nemo_opd.config import ClusterConfig


def local_cpus(cluster: ClusterConfig) -> int:
    """CPUs a local Ray instance offers: this machine's, or what the workers reserve if more."""
    return max(os.cpu_count() or 1, cluster.world_size * cluster.cpus_per_worker)


def init_ray(cluster: ClusterConfig) -> bool:
    """Start a local Ray instance for `cluster`, unless this process is already connected to
    one; returns whether it started one."""
    if ray.is_initialized():
        return False
    ray.init(num_cpus=local_cpus(cluster), include_dashboard=False, log_to_driver=True)
    return True


@contextmanager
def ray_session(cluster: ClusterConfig) -> Iterator[None]:
    """init_ray for the block; Ray is stopped at its end (however it ends) if the block
    started it, and left running if it was already (a cluster the caller attached to)."""
    started = init_ray(cluster)
    try:
        yield
    finally:
        if started:
            ray.shutdown()
