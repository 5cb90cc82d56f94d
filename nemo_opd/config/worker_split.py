"""How the cluster's workers are split between training and (non-colocated) generation.

Pure arithmetic on the config: the config's checks use it to validate a placement at load
time, and setup uses it to place the workers (nemo_opd.distributed.placement).
"""

from typing import NamedTuple

from nemo_opd.config.schema import ClusterConfig, GenerationConfig


class WorkerSplit(NamedTuple):
    """Worker processes that train (policy and teacher) and that generate."""

    training: int
    generation: int


def worker_split(cluster: ClusterConfig, generation: GenerationConfig | None) -> WorkerSplit | None:
    """Split the cluster's workers; None when the non-colocated resources do not fit the cluster.

    Colocated generation shares every worker with training. Non-colocated generation takes
    `resources.gpus_per_node` workers of the single node, or `resources.num_nodes` whole nodes
    of a multi-node cluster; training gets the rest.
    """
    world = cluster.world_size
    if generation is None or generation.colocated.enabled:
        return WorkerSplit(training=world, generation=world)
    resources = generation.colocated.resources
    if resources.gpus_per_node is None or resources.num_nodes is None:
        return None
    reserved = resources.gpus_per_node * resources.num_nodes
    if cluster.num_nodes == 1:
        fits = resources.num_nodes == 1 and resources.gpus_per_node < cluster.gpus_per_node
    else:
        fits = (
            resources.gpus_per_node == cluster.gpus_per_node
            and resources.num_nodes < cluster.num_nodes
        )
    return WorkerSplit(training=world - reserved, generation=reserved) if fits else None
