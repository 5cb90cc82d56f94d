"""The Ray cluster's nodes: which ones a run uses, and where its actors landed.

    nodes = choose_nodes(cfg.cluster, resources)    # cluster.num_nodes nodes, or SetupError
    placement = build_placement_group(world, resources, [nodes[s].node_id for s in slots])
    actor_nodes(workers.actors)                      # [ClusterNode of each actor]

A node can be chosen when its resources hold cluster.gpus_per_node workers (on CPU, their
cpus_per_worker each): the driver's own node first (rank 0, the rendezvous, is then where the
driver is), then the others by address. A cluster with fewer such nodes than cluster.num_nodes
is refused at setup with the list of what it has, instead of a placement group that waits
forever; nodes that have the resources but not free wait for them (build_placement_group's
timeout says so).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import ray

from nemo_opd.config import ClusterConfig
from nemo_opd.distributed.cluster import ClusterResourceError, WorkerResources
from nemo_opd.distributed.waits import get_within
from nemo_opd.utils.text_width import packed

NODE_QUERY_TIMEOUT_S = 120.0
"""How long actors may take to say which node they run on (they are up: a quick call)."""


@dataclass(frozen=True)
class ClusterNode:
    """One Ray node: its id (hex), the address it registered with, and its total resources."""

    node_id: str
    address: str
    resources: Mapping[str, float]

    def describe(self) -> str:
        """'127.0.0.2 (node 1a2b3c4d)'."""
        return f"{self.address} (node {self.node_id[:8]})"


def alive_nodes() -> list[ClusterNode]:
    """The cluster's live nodes, by address."""
    nodes = [
        ClusterNode(node["NodeID"], node["NodeManagerAddress"], dict(node["Resources"]))
        for node in ray.nodes()
        if node["Alive"]
    ]
    return sorted(nodes, key=lambda node: (node.address, node.node_id))


def holds(resources: Mapping[str, float], bundle: Mapping[str, float], count: int) -> bool:
    """Whether `resources` hold `count` bundles."""
    return all(resources.get(name, 0.0) >= amount * count for name, amount in bundle.items())


def choose_nodes(cluster: ClusterConfig, worker: WorkerResources) -> list[ClusterNode]:
    """cluster.num_nodes nodes that can each hold cluster.gpus_per_node workers (see the
    module docstring for the order); ClusterResourceError (a SetupError) when there are fewer."""
    per_node = cluster.gpus_per_node
    fitting = [node for node in alive_nodes() if holds(node.resources, worker.bundle, per_node)]
    if len(fitting) < cluster.num_nodes:
        raise ClusterResourceError(_too_few_nodes(cluster, worker, len(fitting)))
    here = ray.get_runtime_context().get_node_id()
    return sorted(fitting, key=lambda node: node.node_id != here)[: cluster.num_nodes]


def _too_few_nodes(cluster: ClusterConfig, worker: WorkerResources, fitting: int) -> str:
    """The message of choose_nodes' refusal: what the run needs, what each node has."""
    bundle = ", ".join(f"{amount:g} {name}" for name, amount in worker.bundle.items())
    have = "; ".join(
        f"{node.describe()}: "
        + ", ".join(f"{node.resources.get(name, 0):g} {name}" for name in worker.bundle)
        for node in alive_nodes()
    )
    return (
        f"cluster.num_nodes={cluster.num_nodes} needs {cluster.num_nodes} Ray nodes that can "
        f"each hold cluster.gpus_per_node={cluster.gpus_per_node} workers of {bundle}, but the "
        f"Ray cluster has {fitting} such nodes ({have}). Start the missing nodes "
        "(`ray start --address=<head>:<port>` on each; `ray status` lists those that joined) "
        "or lower cluster.num_nodes"
    )


def _node_of_this_actor(_actor: object) -> tuple[str, str]:
    """(node id, node address) of the process it runs in (called through __ray_call__)."""
    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def actor_nodes(actors: Sequence[ray.actor.ActorHandle]) -> list[tuple[str, str]]:
    """(node id, address) where Ray runs each actor, as each actor's runtime context says."""
    refs = [actor.__ray_call__.remote(_node_of_this_actor) for actor in actors]
    return get_within(refs, NODE_QUERY_TIMEOUT_S, "actors reporting which node they run on")


def placement_record(parts: Mapping[str, Sequence[tuple[str, str]]]) -> dict:
    """{"nodes": {node id: address}, "workers": {part: [node id of each worker, in order]}}
    from each part's actor_nodes."""
    nodes = {node_id: address for where in parts.values() for node_id, address in where}
    workers = {name: [node_id for node_id, _ in where] for name, where in parts.items()}
    return {"nodes": nodes, "workers": workers}


def format_placement(record: Mapping) -> str:
    """One line per node: its address and id, then the workers on it ('policy 0, vllm 0')."""
    lines = [f"placement ({len(record['nodes'])} nodes):"]
    for node_id, address in record["nodes"].items():
        here = [
            f"{name} {index}"
            for name, where in record["workers"].items()
            for index, worker_node in enumerate(where)
            if worker_node == node_id
        ]
        lines.append(packed(here, f"  {address} (node {node_id[:8]}): ", ", "))
    return "\n".join(lines)
