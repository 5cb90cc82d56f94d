"""The cluster section: the address of a cluster to attach to, and parallel groups that stay
inside a node when there are several."""

import pytest
from config_errors import problems

from nemo_opd.config import validate_config


@pytest.mark.parametrize("address", ["10.0.0.1:6379", "head-0.cluster.local:6380", "auto"])
def test_a_gcs_address_or_auto_is_accepted(minimal, address):
    minimal["cluster"]["address"] = address
    assert validate_config(minimal).cluster.address == address


@pytest.mark.parametrize(
    ("address", "says"),
    [
        ("http://10.0.0.1:8265", "is a dashboard address (what `ray job submit --address` takes)"),
        ("ray://10.0.0.1:10001", "is a Ray Client address, which this loop does not use"),
        ("10.0.0.1", "is not host:port"),
        ("10.0.0.1:port", "is not host:port"),
        (":6379", "is not host:port"),
        ("10.0.0.1:70000", "is not host:port"),
    ],
)
def test_other_addresses_are_refused_with_what_they_are(minimal, address, says):
    minimal["cluster"]["address"] = address
    [message] = problems(minimal)
    assert message.startswith(f"cluster.address: {address} {says}")


def test_parallel_groups_must_fit_in_a_node_when_there_are_several(minimal):
    minimal["cluster"] = {"num_nodes": 2, "gpus_per_node": 2, "device": "cpu"}
    minimal["policy"]["train_global_batch_size"] = 4
    minimal["policy"]["dtensor_cfg"] = {"tensor_parallel_size": 4}
    assert problems(minimal) == [
        "policy: tensor x context parallel size (4 x 1 = 4) must divide cluster.gpus_per_node "
        "(2) on several nodes: each group's collectives run at every layer and stay inside one "
        "node"
    ]
    minimal["policy"]["dtensor_cfg"] = {"tensor_parallel_size": 2}
    minimal["teacher"]["dtensor_cfg"] = {"context_parallel_size": 2}
    assert problems(minimal) == []


def test_one_node_holds_any_group(minimal):
    minimal["cluster"] = {"num_nodes": 1, "gpus_per_node": 4, "device": "cpu"}
    minimal["policy"]["dtensor_cfg"] = {"tensor_parallel_size": 4}
    assert problems(minimal) == []
