"""Which executor runs a run's workers (cluster.executor): Ray actors, objects in this process,
or processes of this machine.

A run needs Ray when it has more than one worker (cluster.num_nodes x cluster.gpus_per_node:
the ranks of a model are processes that join one torch.distributed group) or attaches to a
cluster (cluster.address). auto also picks Ray for a served teacher (a run that scores on a
server is one of a deployment's, and Ray is how those run), but a served teacher is an HTTP
client of the driver: an explicit "local" or "processes" runs it too (a one-GPU machine without
Ray, its teacher on a server elsewhere). Otherwise auto picks "local": the student, the teacher
and the generation engine in the driver's process, no Ray started or imported. The RAY_ADDRESS
environment variable (`ray job submit` sets it) makes auto pick Ray too; an explicit "local"
ignores it. "processes" is chosen by config only: every worker a process of the driver's
machine, no Ray (one node, no cluster).
"""

import os
from collections.abc import Mapping
from typing import Literal

from nemo_opd.config.schema import DistillationConfig

RAY_ADDRESS_ENV = "RAY_ADDRESS"


def ray_reasons(cfg: DistillationConfig) -> list[str]:
    """What in the config needs Ray, one phrase each (empty when nothing does)."""
    cluster = cfg.cluster
    reasons = []
    if cluster.world_size > 1:
        reasons.append(
            f"{cluster.world_size} workers (cluster.num_nodes {cluster.num_nodes} x "
            f"cluster.gpus_per_node {cluster.gpus_per_node}), one process each"
        )
    return reasons + _ray_services(cfg)


def _ray_services(cfg: DistillationConfig) -> list[str]:
    """What in the config needs Ray whatever runs the workers: a cluster to attach to."""
    address = cfg.cluster.address
    return [f"cluster.address {address} (a Ray cluster to attach to)"] if address else []


def is_served(cfg: DistillationConfig) -> bool:
    """Whether the run's teacher is served (teacher.server.enabled)."""
    return cfg.teacher is not None and cfg.teacher.server.enabled


def run_executor(
    cfg: DistillationConfig, environ: Mapping[str, str] = os.environ
) -> Literal["ray", "local", "processes"]:
    """cluster.executor, with auto resolved: "local" when nothing needs Ray (ray_reasons), the
    teacher is not served and RAY_ADDRESS is unset in `environ`, else "ray"."""
    chosen = cfg.cluster.executor
    if chosen != "auto":
        return chosen
    needs_ray = ray_reasons(cfg) or is_served(cfg) or environ.get(RAY_ADDRESS_ENV)
    return "ray" if needs_ray else "local"


def uses_ray(executor: str) -> bool:
    """Whether a resolved executor runs the workers as Ray actors (a Ray session needed)."""
    return executor == "ray"


def check_executor(cfg: DistillationConfig) -> list[str]:
    """cluster.executor local runs one worker in the driver's process: no more than one worker,
    no cluster.address; processes runs each worker in a process of this machine: one node, no
    cluster.address."""
    executor = cfg.cluster.executor
    if executor == "local":
        reasons = ray_reasons(cfg)
        where = "every worker in this one process"
    elif executor == "processes":
        nodes = cfg.cluster.num_nodes
        reasons = [f"cluster.num_nodes {nodes} (one node only)"] if nodes > 1 else []
        reasons += _ray_services(cfg)
        where = "every worker a process of this machine"
    else:
        return []
    if not reasons:
        return []
    return [
        f"cluster.executor is {executor} ({where}), but the run needs Ray: "
        f"{'; '.join(reasons)}; set cluster.executor=auto or ray"
    ]
