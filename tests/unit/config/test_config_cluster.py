"""The cluster section: the address of a cluster to attach to, and parallel groups that stay
inside a node when there are several."""

import pytest
from config_errors import problems

from nemo_opd.config import validate_config
from nemo_opd.config.executor import run_executor


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


def one_worker(minimal) -> dict:
    minimal["cluster"] = {"num_nodes": 1, "gpus_per_node": 1, "device": "cpu"}
    minimal["policy"]["train_micro_batch_size"] = 4
    return minimal


@pytest.mark.parametrize(
    ("change", "executor"),
    [
        ({}, "local"),  # one worker, nothing else: the driver's process
        ({"cluster": {"gpus_per_node": 2}}, "ray"),
        ({"cluster": {"address": "10.0.0.1:6379"}}, "ray"),
        ({"teacher": {"server": {"enabled": True}}}, "ray"),
        ({"cluster": {"executor": "ray"}}, "ray"),
    ],
)
def test_auto_runs_in_one_process_where_nothing_needs_ray(minimal, change, executor):
    raw = one_worker(minimal)
    for section, keys in change.items():
        raw[section].update(keys)
    assert run_executor(validate_config(raw), environ={}) == executor


def test_a_ray_address_in_the_environment_makes_auto_pick_ray(minimal):
    cfg = validate_config(one_worker(minimal))
    assert run_executor(cfg, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == "ray"
    local = validate_config({**one_worker(minimal), "cluster": {"executor": "local"}})
    assert run_executor(local, environ={"RAY_ADDRESS": "10.0.0.1:6379"}) == "local"


def test_local_with_what_needs_ray_is_refused_with_the_reason(minimal):
    minimal["cluster"] = {
        "num_nodes": 1,
        "gpus_per_node": 2,
        "device": "cpu",
        "executor": "local",
        "address": "10.0.0.1:6379",
    }
    assert problems(minimal) == [
        "cluster.executor is local (every worker in this one process), but the run needs Ray: 2 "
        "workers (cluster.num_nodes 1 x cluster.gpus_per_node 2), one process each; "
        "cluster.address 10.0.0.1:6379 (a Ray cluster to attach to); set cluster.executor=auto "
        "or ray"
    ]
    assert problems({**one_worker(minimal), "cluster": {"executor": "local"}}) == []


@pytest.mark.parametrize("executor", ["local", "processes"])
def test_a_served_teacher_runs_without_ray_where_the_config_says_so(minimal, executor):
    """auto picks Ray for a served teacher; local and processes, set, run it (the driver is
    its HTTP client)."""
    raw = one_worker(minimal)
    raw["teacher"].update({"server": {"enabled": True}})
    raw["cluster"] = {**raw.get("cluster", {}), "executor": executor}
    assert problems(raw) == []
    assert run_executor(validate_config(raw), environ={}) == executor


def test_processes_run_several_workers_of_one_node_and_refuse_what_needs_ray(minimal):
    several = {"num_nodes": 1, "gpus_per_node": 2, "device": "cpu", "executor": "processes"}
    assert problems({**minimal, "cluster": several}) == []
    assert run_executor(validate_config({**minimal, "cluster": several}), environ={}) == (
        "processes"
    )
    minimal["cluster"] = {**several, "num_nodes": 2, "address": "10.0.0.1:6379"}
    assert problems(minimal) == [
        "cluster.executor is processes (every worker a process of this machine), but the run "
        "needs Ray: cluster.num_nodes 2 (one node only); cluster.address 10.0.0.1:6379 (a Ray "
        "cluster to attach to); set cluster.executor=auto or ray"
    ]
