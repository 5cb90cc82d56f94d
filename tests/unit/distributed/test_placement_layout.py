"""Where a run's bundles go: one per worker, gpus_per_node to a node in order (training first,
then non-colocated generation), and which bundles hold a generation engine."""

import pytest

from nemo_opd.config import ClusterConfig, GenerationConfig
from nemo_opd.config.worker_split import worker_split
from nemo_opd.distributed.cluster import describe_device
from nemo_opd.distributed.placement import bundle_node_slots, generation_bundles


def generation(colocated: bool, nodes: int | None = None, per_node: int | None = None):
    resources = {"num_nodes": nodes, "gpus_per_node": per_node}
    return GenerationConfig(
        max_new_tokens=8,
        vllm_cfg={"max_model_len": 64},
        colocated={"enabled": colocated, "resources": resources},
    )


def test_ranks_fill_one_node_before_the_next():
    cluster = ClusterConfig(num_nodes=3, gpus_per_node=2)
    assert bundle_node_slots(cluster) == [0, 0, 1, 1, 2, 2]
    assert bundle_node_slots(ClusterConfig(num_nodes=1, gpus_per_node=4)) == [0, 0, 0, 0]


@pytest.mark.parametrize(
    ("nodes", "per_node", "device", "engines"),
    [
        (1, 4, "cuda", [0, 1, 2, 3]),  # colocated: one engine per training bundle
        (2, 2, "cuda", [0, 1, 2, 3]),
        (1, 4, "cpu", [0]),  # CPU: one engine per node, in its first bundle
        (2, 2, "cpu", [0, 2]),
        (3, 1, "cpu", [0, 1, 2]),
    ],
)
def test_colocated_engines(nodes, per_node, device, engines):
    cluster = ClusterConfig(num_nodes=nodes, gpus_per_node=per_node)
    gen = generation(colocated=True)
    assert generation_bundles(cluster, worker_split(cluster, gen), gen, device) == engines


@pytest.mark.parametrize(
    ("nodes", "per_node", "gen_nodes", "gen_per_node", "device", "engines"),
    [
        (1, 8, 1, 2, "cuda", [6, 7]),  # the node's last devices
        (4, 2, 1, 2, "cuda", [6, 7]),  # the last node, whole
        (4, 2, 2, 2, "cpu", [4, 6]),  # one engine on each generation node
        (1, 4, 1, 1, "cpu", [3]),
    ],
)
def test_engines_on_their_own_devices(nodes, per_node, gen_nodes, gen_per_node, device, engines):
    cluster = ClusterConfig(num_nodes=nodes, gpus_per_node=per_node)
    gen = generation(colocated=False, nodes=gen_nodes, per_node=gen_per_node)
    split = worker_split(cluster, gen)
    found = generation_bundles(cluster, split, gen, device)
    assert found == engines
    assert all(bundle >= split.training for bundle in found)


@pytest.mark.parametrize(
    ("configured", "device", "gpus", "line"),
    [
        ("auto", "cuda", 8.0, "device: cuda (cluster.device is auto and Ray sees 8 GPUs)"),
        ("auto", "cpu", 0.0, "device: cpu (cluster.device is auto and Ray sees no GPU: every"),
        ("cpu", "cpu", 8.0, "device: cpu (cluster.device)"),
    ],
)
def test_the_device_line_says_why(configured, device, gpus, line):
    # "auto" used to fall back to the CPU without a word.
    described = describe_device(ClusterConfig(device=configured), device, gpus)
    assert described.startswith(line)
