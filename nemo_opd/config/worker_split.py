"""How the cluster's workers are split between training and (non-colocated) generation.

Arithmetic on the config: check_generation_placement (one of nemo_opd.config.checks.CHECKS)
refuses a placement that does not fit at load time, and setup uses the split to place the
workers (nemo_opd.distributed.placement).
"""

from collections.abc import Iterator
from typing import NamedTuple

from nemo_opd.config.model_schema import GenerationConfig
from nemo_opd.config.schema import ClusterConfig, DistillationConfig


class WorkerSplit(NamedTuple):
    """Worker processes that train (policy and teacher) and that generate."""

    training: int
    generation: int


def worker_split(cluster: ClusterConfig, generation: GenerationConfig | None) -> WorkerSplit | None:
    """Split the cluster's workers; None when the non-colocated resources do not fit the cluster.
    Colocated generation shares every worker with training; non-colocated generation takes
    `resources.gpus_per_node` workers of the single node, or `resources.num_nodes` whole nodes
    of a multi-node cluster, and training gets the rest."""
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


def check_generation_placement(cfg: DistillationConfig) -> Iterator[str]:
    """Non-colocated generation must leave workers for training; vLLM's tensor_parallel_size is
    1 (each generation worker runs one single-device vLLM engine)."""
    generation, cluster = cfg.policy.generation, cfg.cluster
    if generation is None:
        return
    if worker_split(cluster, generation) is None:
        resources = generation.colocated.resources
        yield (
            f"policy.generation.colocated.resources (gpus_per_node={resources.gpus_per_node}, "
            f"num_nodes={resources.num_nodes}) does not fit cluster (num_nodes="
            f"{cluster.num_nodes}, gpus_per_node={cluster.gpus_per_node}) with "
            "policy.generation.colocated.enabled false: both must be set; on one node, "
            "generation takes fewer than all of its gpus_per_node; on several nodes, generation "
            "takes whole nodes (the same gpus_per_node) and fewer than num_nodes"
        )
    elif (vllm_tp := generation.vllm_cfg.tensor_parallel_size) != 1:
        yield (
            f"policy.generation.vllm_cfg.tensor_parallel_size ({vllm_tp}) is not supported yet: "
            "each generation worker runs one single-device vLLM engine (data parallel over the "
            "generation workers); set it to 1"
        )
