"""Choosing a run's nodes on a live Ray (one local node here; tests/functional/
test_multinode_tiny.py has two), and the record of where Ray placed the workers."""

import pytest
import ray

from nemo_opd.config import ClusterConfig
from nemo_opd.distributed.cluster import ClusterResourceError, WorkerResources
from nemo_opd.distributed.nodes import (
    actor_nodes,
    alive_nodes,
    choose_nodes,
    format_placement,
    placement_record,
)


@pytest.fixture(scope="module")
def local_ray(own_ray):
    """Ray's nodes as a fresh instance of its own has them (two CPUs, no actor)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_the_one_node_that_holds_the_workers(local_ray):
    [node] = alive_nodes()
    chosen = choose_nodes(ClusterConfig(gpus_per_node=2, device="cpu"), WorkerResources("cpu", 1))
    assert chosen == [node] and node.node_id == ray.get_runtime_context().get_node_id()


@pytest.mark.parametrize(
    ("cluster", "says"),
    [
        (ClusterConfig(num_nodes=2, device="cpu"), "has 1 such nodes"),
        (ClusterConfig(gpus_per_node=3, device="cpu"), "has 0 such nodes"),
    ],
)
def test_too_few_nodes_are_refused_with_what_each_has(local_ray, cluster, says):
    [node] = alive_nodes()
    with pytest.raises(ClusterResourceError) as caught:
        choose_nodes(cluster, WorkerResources("cpu", 1))
    message = str(caught.value)
    assert message.startswith(f"cluster.num_nodes={cluster.num_nodes} needs ")
    assert f"workers of 1 CPU, but the Ray cluster {says}" in message
    assert f"{node.address} (node {node.node_id[:8]}): 2 CPU" in message
    assert "or lower cluster.num_nodes" in message


def test_actor_nodes_is_where_ray_runs_them(local_ray):
    @ray.remote(num_cpus=0)
    class Idle:
        pass

    actors = [Idle.remote() for _ in range(2)]
    [node] = alive_nodes()
    assert actor_nodes(actors) == [(node.node_id, node.address)] * 2


def test_placement_record_and_its_lines():
    record = placement_record(
        {
            "policy": [("a" * 56, "10.0.0.1"), ("b" * 56, "10.0.0.2")],
            "vllm": [("b" * 56, "10.0.0.2")],
        }
    )
    assert record == {
        "nodes": {"a" * 56: "10.0.0.1", "b" * 56: "10.0.0.2"},
        "workers": {"policy": ["a" * 56, "b" * 56], "vllm": ["b" * 56]},
    }
    assert format_placement(record).splitlines() == [
        "placement (2 nodes):",
        "  10.0.0.1 (node aaaaaaaa): policy 0",
        "  10.0.0.2 (node bbbbbbbb): policy 1, vllm 0",
    ]
