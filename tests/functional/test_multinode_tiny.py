"""The tiny loop on a real two-node Ray cluster on this machine (tests/functional/ray_cluster.py:
two `ray start` nodes on 127.0.0.2 and 127.0.0.3, two CPUs each), started once for the module.

- Two nodes: with RAY_ADDRESS pointing at the cluster and cluster.num_nodes=2, the policy,
  teacher and vLLM workers land on both nodes (as Ray reports each actor's node), and the
  first steps' losses are those of the same layout on one node (its two ranks processes of
  this machine, no Ray: the executors log the same metrics, test_executors_tiny.py, which
  also shows the loop stopping the Ray it started). The refit crosses nodes through the
  object store: the engine on the second node samples with the student's weights (the
  logprob check stays at the single-node run's).
- The loop attached to the cluster leaves it running (both nodes still alive afterwards).
- Bad input, each one clear error at setup (exit status 2, "error: ..."), in seconds: more
  nodes than the cluster has; a checkpoint directory that one node cannot see (the second node
  runs in a mount namespace where a tmpfs hides the directory, as a node-local disk would);
  a cluster address where nothing answers.
"""

import io
import json
import tempfile
import time
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import ray
from ray_cluster import LocalCluster, free_port
from run_metrics import read_metrics
from short_runs import LOCKSTEP, short_run_args

from nemo_opd.cli import main
from nemo_opd.distributed.address import probe_head

pytestmark = pytest.mark.usefixtures("own_ray")  # a cluster of its own

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "distillation_tiny.yaml"
STEPS = 2
SAME_DATA = ("train/num_tokens", "train/reward", "rollout/mean_generated_tokens")
SAME_LOSSES = ("train/loss", "train/forward_kl", "train/reverse_kl")
TWO_WORKERS = ("cluster.gpus_per_node=1", "cluster.cpus_per_worker=1")


@pytest.fixture(scope="module")
def cluster():
    # A short path of its own: Ray's socket paths under it must stay below 108 characters.
    with (
        tempfile.TemporaryDirectory(prefix="nemo-opd-ray-") as root,
        LocalCluster(Path(root), private_dir=Path(root) / "node_local") as started,
    ):
        yield started


def loop_args(
    run_dir: Path, *extra: str, checkpoint_dir: Path | None = None, executor: str = "ray"
) -> list[str]:
    """The short run's arguments; on Ray (about Ray clusters, whatever auto would pick)."""
    on = (f"cluster.executor={executor}",)
    return short_run_args(
        CONFIG, run_dir, STEPS, *LOCKSTEP, *on, *extra, checkpoint_dir=checkpoint_dir
    )


@pytest.fixture(scope="module")
def single_node(tmp_path_factory, cluster):
    """The same layout on one node: two ranks, processes of this machine (no Ray; the
    cluster runs meanwhile and is not used)."""
    run_dir = tmp_path_factory.mktemp("single")
    on_one_node = ("cluster.num_nodes=1", "cluster.gpus_per_node=2")
    with pytest.MonkeyPatch.context() as patch, redirect_stdout(io.StringIO()):
        patch.delenv("RAY_ADDRESS", raising=False)
        status = main(loop_args(run_dir, *on_one_node, executor="processes"))
    assert status == 0
    return read_metrics(run_dir)


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory, cluster, single_node):
    """The run on both nodes, one worker each, attached through RAY_ADDRESS; after the local
    run, as a process that has run a local Ray before attaching would."""
    run_dir = tmp_path_factory.mktemp("two_nodes")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAY_ADDRESS", cluster.address)
        status = main(loop_args(run_dir, "cluster.num_nodes=2", *TWO_WORKERS))
    assert status == 0
    return read_metrics(run_dir), _placement(run_dir)


def test_every_part_runs_on_both_nodes(cluster, two_nodes):
    _, placement = two_nodes
    assert sorted(placement["nodes"].values()) == cluster.node_addresses
    for part in ("policy", "teacher", "vllm"):
        where = [placement["nodes"][node] for node in placement["workers"][part]]
        assert sorted(where) == cluster.node_addresses, part
    # Ranks fill nodes in order: rank 0 (the rendezvous) next to the driver, on the head.
    assert placement["nodes"][placement["workers"]["policy"][0]] == cluster.node_addresses[0]


def test_two_nodes_train_as_one_node_does(single_node, two_nodes):
    one = single_node
    two, _ = two_nodes
    assert sorted(one) == sorted(two) == list(range(1, STEPS + 1))
    for step in range(1, STEPS + 1):
        for key in SAME_DATA:  # the same samples: seeded per prompt, whichever engine runs it
            assert two[step][key] == one[step][key], f"step {step} {key}"
        for key in SAME_LOSSES:  # the same layout (two data-parallel ranks), other machines
            assert two[step][key] == pytest.approx(one[step][key], rel=1e-5), (
                f"step {step} {key}: two nodes {two[step][key]} vs one {one[step][key]}"
            )
    # Step 2 samples after a refit: the engine on the second node got the student's new weights
    # through the object store (a stale engine would differ from the student by far more).
    mismatch = "generation/logprob_mismatch"
    assert two[2][mismatch] < 1e-5 and two[2][mismatch] == pytest.approx(one[2][mismatch], rel=0.01)


def test_the_loop_leaves_an_attached_cluster_running(cluster, two_nodes):
    assert not ray.is_initialized()
    assert cluster.alive()
    probe_head(cluster.address, timeout_s=5.0)
    ray.init(address=cluster.address, log_to_driver=False)
    try:
        alive = sorted(node["NodeManagerAddress"] for node in ray.nodes() if node["Alive"])
    finally:
        ray.shutdown()
    assert alive == cluster.node_addresses


def fails_at_setup(capsys, args: list[str]) -> tuple[str, float]:
    """Run the loop expecting setup to refuse it: (its error line, seconds it took)."""
    started = time.monotonic()
    status = main(args)
    took = time.monotonic() - started
    err = capsys.readouterr().err
    assert status == 2, err
    assert not ray.is_initialized()
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1 and "Traceback" not in err, err
    print(lines[0], f"({took:.1f} s)")
    return lines[0], took


def test_more_nodes_than_the_cluster_has(cluster, tmp_path, capsys):
    three = ("cluster.num_nodes=3", "distillation.num_prompts_per_step=12")
    args = loop_args(tmp_path, f"cluster.address={cluster.address}", *three, *TWO_WORKERS)
    error, took = fails_at_setup(capsys, [*args, "policy.train_global_batch_size=24"])
    assert "cluster.num_nodes=3 needs 3 Ray nodes" in error
    assert "the Ray cluster has 2 such nodes" in error
    assert all(address in error for address in cluster.node_addresses)
    assert took < 60
    assert cluster.alive()


def test_a_checkpoint_dir_one_node_cannot_see(cluster, tmp_path, capsys):
    if not cluster.private_dir_hidden:
        pytest.skip("needs a mount namespace (unshare --mount) to hide a directory from a node")
    hidden = cluster.private_dir / "run"
    attach = (f"cluster.address={cluster.address}", "cluster.num_nodes=2", *TWO_WORKERS)
    error, took = fails_at_setup(capsys, loop_args(tmp_path, *attach, checkpoint_dir=hidden))
    second = cluster.node_addresses[1]
    assert f"checkpointing.checkpoint_dir {hidden} is not visible from {second} (node " in error
    assert cluster.node_addresses[0] not in error  # the head (the driver's node) sees it
    assert "mount at the same path" in error
    assert took < 60
    assert not any(hidden.glob(".nemo_opd_node_check_*"))  # the marker is cleaned up


def test_an_address_that_does_not_answer(tmp_path, capsys):
    silent = f"127.0.0.2:{free_port('127.0.0.2')}"
    args = loop_args(tmp_path, f"cluster.address={silent}", "cluster.num_nodes=2", *TWO_WORKERS)
    error, took = fails_at_setup(capsys, args)
    assert error.startswith(f"error: cluster.address: cannot reach a Ray head at {silent}")
    assert took < 15


def _placement(run_dir: Path) -> dict:
    return json.loads((run_dir / "logs" / "placement.json").read_text())
