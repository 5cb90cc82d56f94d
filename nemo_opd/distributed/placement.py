"""Which placement-group bundle holds which worker: training ranks, then generation engines.

Pure arithmetic on the config (no Ray); the split of the workers between training and
generation is the config's own (nemo_opd.config.worker_split), checked at load time.
"""

from nemo_opd.config import ClusterConfig, GenerationConfig
from nemo_opd.config.worker_split import WorkerSplit


def bundle_node_slots(cluster: ClusterConfig) -> list[int]:
    """Node slot (0 .. num_nodes - 1) of each bundle of a run's placement group.

    The group holds one bundle per worker of the cluster (cluster.world_size): the training
    ranks first, then the non-colocated generation workers, gpus_per_node to a node. Ranks that
    are neighbours (a tensor- or context-parallel group) thus share a node, data-parallel
    replicas spread over nodes, and non-colocated generation gets the last nodes (or, on one
    node, the last devices) to itself.
    """
    return [bundle // cluster.gpus_per_node for bundle in range(cluster.world_size)]


def generation_bundles(
    cluster: ClusterConfig,
    split: WorkerSplit,
    generation: GenerationConfig | None,
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
