"""The workers' device and resources: checks against the live Ray cluster, and the placement
group. Ray is imported by the functions that use it: a run in one process (the local executor)
reads its device here without importing Ray."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nemo_opd.config import ClusterConfig
from nemo_opd.errors import SetupError

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

NODE_ID_LABEL = "ray.io/node-id"
"""The label Ray gives every node: its id (what a bundle's label selector pins it to)."""


class ClusterResourceError(SetupError):
    """The Ray cluster cannot host the workers the config asks for."""


@dataclass(frozen=True)
class WorkerResources:
    """What one worker process reserves."""

    device_type: str
    cpus: int

    @property
    def bundle(self) -> dict[str, float]:
        """The placement-group bundle of one worker."""
        bundle = {"CPU": float(self.cpus)}
        if self.device_type == "cuda":
            bundle["GPU"] = 1.0
        return bundle


def gpus_seen(executor: str = "ray") -> float:
    """GPUs the workers can use: the Ray cluster's, or this machine's (the local and processes
    executors)."""
    if executor != "ray":
        import torch

        return float(torch.cuda.device_count())
    import ray

    return ray.cluster_resources().get("GPU", 0)


def resolve_device_type(cluster: ClusterConfig, executor: str = "ray") -> str:
    """cluster.device, with "auto" meaning cuda when the executor sees a GPU, else cpu."""
    if cluster.device != "auto":
        return cluster.device
    return "cuda" if gpus_seen(executor) > 0 else "cpu"


def describe_device(cluster: ClusterConfig, device: str, gpus: float, executor: str = "ray") -> str:
    """One line for the start of a run: the device the workers use (resolve_device_type) and
    why, so that "auto" falling back to the CPU is never silent."""
    if cluster.device != "auto":
        return f"device: {device} (cluster.device)"
    who = {"local": "this process sees", "processes": "this machine sees"}.get(executor, "Ray sees")
    if device == "cuda":
        return f"device: cuda (cluster.device is auto and {who} {gpus:g} GPUs)"
    return (
        f"device: cpu (cluster.device is auto and {who} no GPU: every worker and vLLM run on "
        "the CPU; set cluster.device=cuda to require GPUs)"
    )


def check_resources(num_workers: int, resources: WorkerResources) -> None:
    """Fail with a clear message when the Ray cluster cannot hold num_workers such workers."""
    import ray

    total = ray.cluster_resources()
    for name, per_worker in resources.bundle.items():
        have = total.get(name, 0.0)
        need = per_worker * num_workers
        if need > have:
            raise ClusterResourceError(
                f"{num_workers} workers need {need:g} {name} ({per_worker:g} each), but the Ray "
                f"cluster has {have:g}; lower cluster.gpus_per_node / cluster.num_nodes / "
                "cluster.cpus_per_worker or start Ray with more resources"
            )


def check_machine_gpus(num_workers: int, gpus: float, executor: str) -> None:
    """Fail with a clear message when this machine cannot give each of num_workers workers a
    GPU of its own (the local and processes executors: worker r takes the r-th visible GPU)."""
    if num_workers > gpus:
        raise ClusterResourceError(
            f"{num_workers} worker(s) on cuda, and cluster.executor {executor} gives worker r "
            f"the r-th GPU this machine makes visible, but it has {gpus:g}; lower "
            "cluster.gpus_per_node, make more GPUs visible (CUDA_VISIBLE_DEVICES), or run on "
            "the CPU (cluster.device=cpu)"
        )


def build_placement_group(
    num_workers: int,
    resources: WorkerResources,
    timeout_s: float = 60.0,
    nodes: Sequence[str] | None = None,
) -> PlacementGroup:
    """Reserve one bundle per worker and wait for it: bundle i on the node whose id is
    nodes[i], or, without `nodes`, packed onto as few nodes as possible."""
    import ray
    from ray.util.placement_group import placement_group

    check_resources(num_workers, resources)
    selectors = None
    if nodes is not None:
        if len(nodes) != num_workers:
            raise ValueError(f"{len(nodes)} nodes given for {num_workers} bundles")
        selectors = [{NODE_ID_LABEL: node} for node in nodes]
    group = placement_group(
        [resources.bundle] * num_workers, strategy="PACK", bundle_label_selector=selectors
    )
    ready, _ = ray.wait([group.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(group)
        raise ClusterResourceError(
            f"could not reserve {num_workers} x {resources.bundle} within {timeout_s:g} s "
            f"(free now: {ray.available_resources()}); other actors may hold the resources"
        )
    return group


def release_placement(group: PlacementGroup) -> None:
    """Give a placement group's resources back to the Ray cluster."""
    import ray

    ray.util.remove_placement_group(group)
