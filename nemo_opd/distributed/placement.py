"""How the cluster's workers are split between training and (non-colocated) generation.

Pure arithmetic on the config (no Ray): the config's checks use it to validate a placement at
load time, and setup uses it to place the workers.
"""

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:  # the config's checks import this module: no import back at run time
    from nemo_opd.config import ClusterConfig, GenerationConfig


class WorkerSplit(NamedTuple):
    """Worker processes that train (policy and teacher) and that generate."""

    training: int
    generation: int


def worker_split(
    cluster: "ClusterConfig", generation: "GenerationConfig | None"
) -> WorkerSplit | None:
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


def bundle_node_slots(cluster: "ClusterConfig") -> list[int]:
    """Node slot (0 .. num_nodes - 1) of each bundle of a run's placement group.

    The group holds one bundle per worker of the cluster (cluster.world_size): the training
    ranks first, then the non-colocated generation workers, gpus_per_node to a node. Ranks that
    are neighbours (a tensor- or context-parallel group) thus share a node, data-parallel
    replicas spread over nodes, and non-colocated generation gets the last nodes (or, on one
    node, the last devices) to itself.
    """
    return [bundle // cluster.gpus_per_node for bundle in range(cluster.world_size)]


def generation_bundles(
    cluster: "ClusterConfig",
    split: WorkerSplit,
    generation: "GenerationConfig | None",
    device_type: str,
) -> list[int]:
    """The placement-group bundles that hold a generation engine, one engine each.

    On CUDA, every generation worker's bundle: the training bundles when generation is
    colocated (shared), the bundles after them otherwise. On CPU, one engine per node that
    generates, in that node's first such bundle: the engine reserves no CPU and runs on the
    node's cores while training waits (nemo_opd.generation.vllm_generation).
    """
    colocated = generation is None or generation.colocated.enabled
    first = 0 if colocated else split.training
    bundles = range(first, first + split.generation)
    if device_type == "cuda":
        return list(bundles)
    slots = bundle_node_slots(cluster)
    first_of_node: dict[int, int] = {}
    for bundle in bundles:
        first_of_node.setdefault(slots[bundle], bundle)
    return list(first_of_node.values())
