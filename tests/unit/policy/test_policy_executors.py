"""A Policy of one worker computes the same in the driver's process (the local executor) as in a
Ray actor: the same training metrics, top-k, log-probs, gathered weights and checkpoint, for the
DTensor engine, LoRA and Megatron, at the same thread count (one, as the Ray worker's
cluster.cpus_per_worker). A worker's error reads the same under both, and the worker serves the
next call. A Policy of two ranks under tensor parallelism computes the same in processes forked
on this machine (the processes executor, which the other policy tests use for several ranks) as
in Ray actors. That comparison is of the executors, which carry the same calls and environment
whatever the engine: it runs on the DTensor engine; Megatron's layouts of two ranks are checked
on the processes executor against their references (test_policy_parallel.py,
test_megatron_engine.py) and in the loop (test_gkd_tiny.py's routed Megatron TP2 run)."""

import pytest
import ray
import torch
import torch.distributed as dist
from tiny_policies import cpu_cluster, make_batch, policy_config

from nemo_opd.distributed.process_group import init_local_process_group
from nemo_opd.distributed.worker_group import WorkerError
from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.policy import Policy

LAYOUTS = {
    "dtensor": {},
    "lora": {"lora__enabled": True, "lora__rank": 2, "lora__target_modules": ["q_proj"]},
    "megatron": {"dtensor_cfg__enabled": False, "megatron_cfg__enabled": True},
}


TP2 = {"dtensor": {"dtensor_cfg__tensor_parallel_size": 2}}


def run_policy(executor: str, cfg, tmp_path, workers: int = 1) -> dict:
    """A worker's error first (the worker serves the next call), then train two steps, score,
    gather and save: everything the loop asks of a policy."""
    name = f"policy_{executor}"
    policy = Policy(cfg, cpu_cluster(workers), name=name, executor=executor)
    loss_fn = DistillationLossFn(implementation="torch")
    try:
        with pytest.raises(WorkerError, match=rf"^{name}: worker rank \d raised FileNotFoundError"):
            policy.load(str(tmp_path / "nowhere"))
        assert policy.step == 0
        metrics = [policy.train(make_batch(8, seed=seed), loss_fn) for seed in (1, 2)]
        batch = make_batch(4, seed=3, teacher=False)
        handle = policy.full_weights_ref()
        weights = ray.get(handle) if executor == "ray" else handle
        policy.save(str(tmp_path / executor))
        return {
            "metrics": metrics,
            "evaluated": policy.evaluate(make_batch(4, seed=4), loss_fn),
            "topk": policy.get_topk_logits(batch, 4),
            "logprobs": policy.get_logprobs(batch),
            "weights": weights,
            "step": policy.step,
        }
    finally:
        policy.shutdown()


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_one_process_computes_as_a_ray_worker(layout, model_dirs, ray_session, tmp_path):
    cfg = policy_config(model_dirs["untied"], **LAYOUTS[layout])
    ray_run = run_policy("ray", cfg, tmp_path)
    local_run = run_policy("local", cfg, tmp_path)
    assert local_run["metrics"] == ray_run["metrics"]
    assert local_run["evaluated"] == ray_run["evaluated"]
    assert local_run["step"] == ray_run["step"] == 4  # two batches of 8 rows, 4 per step
    for name in ("topk", "logprobs"):
        torch.testing.assert_close(local_run[name], ray_run[name], rtol=0, atol=0)
    assert local_run["weights"].keys() == ray_run["weights"].keys()
    for name, tensor in ray_run["weights"].items():
        torch.testing.assert_close(local_run["weights"][name], tensor, rtol=0, atol=0)
    for saved in (tmp_path / "ray").iterdir():
        if saved.suffix == ".safetensors":
            assert (tmp_path / "local" / saved.name).read_bytes() == saved.read_bytes()


@pytest.mark.parametrize("layout", list(TP2))
def test_forked_processes_compute_as_ray_workers(layout, model_dirs, ray_session, tmp_path):
    cfg = policy_config(model_dirs["untied"], **TP2[layout])
    ray_run = run_policy("ray", cfg, tmp_path, workers=2)
    forked = run_policy("processes", cfg, tmp_path, workers=2)
    assert forked["metrics"] == ray_run["metrics"]
    assert forked["evaluated"] == ray_run["evaluated"]
    assert forked["step"] == ray_run["step"] == 4
    for name in ("topk", "logprobs"):
        torch.testing.assert_close(forked[name], ray_run[name], rtol=0, atol=0)
    for name, tensor in ray_run["weights"].items():
        torch.testing.assert_close(forked["weights"][name], tensor, rtol=0, atol=0)
    for saved in (tmp_path / "ray").rglob("*.safetensors"):
        assert (tmp_path / "processes" / saved.relative_to(tmp_path / "ray")).read_bytes() == (
            saved.read_bytes()
        )


@pytest.mark.parametrize("layout", ["dtensor", "megatron"])
def test_weights_handed_over_in_one_process_are_a_snapshot(layout, model_dirs):
    """The tensors a local policy hands to generation stay as they were when the student trains
    on (under Ray they are a copy in the object store)."""
    cfg = policy_config(model_dirs["untied"], **LAYOUTS[layout])
    policy = Policy(cfg, cpu_cluster(1), executor="local")
    try:
        before = {name: t.clone() for name, t in policy.full_weights_ref().items()}
        handed = policy.full_weights_ref()
        policy.train(make_batch(8, seed=1), DistillationLossFn(implementation="torch"))
        for name, tensor in handed.items():
            assert torch.equal(tensor, before[name]), name
        now = policy.full_weights_ref()
        assert any(not torch.equal(tensor, now[name]) for name, tensor in handed.items())
    finally:
        policy.shutdown()


def test_every_model_of_the_process_shares_its_one_rank_group():
    init_local_process_group("cpu")
    group = dist.group.WORLD
    init_local_process_group("cpu")  # a second model joins the same group
    assert dist.group.WORLD is group and dist.get_world_size() == 1
    with pytest.raises(RuntimeError, match="needs a one-rank nccl group"):
        init_local_process_group("cuda")


def test_a_megatron_run_in_a_process_whose_group_was_made_again(model_dirs):
    """A second Megatron policy in one process after the process's group was destroyed and made
    again (vLLM's teardown ends it at the end of a run in one process) starts, and scores as
    the first did: Megatron's model-parallel state from the first is made again in the new
    group, not used with groups torch no longer knows."""
    cfg = policy_config(model_dirs["untied"], **LAYOUTS["megatron"])
    batch = make_batch(4, seed=3, teacher=False)
    scores = []
    for _ in range(2):
        policy = Policy(cfg, cpu_cluster(1), executor="local", optimizer=False)
        try:
            scores.append(policy.get_logprobs(batch))
        finally:
            policy.shutdown()
        dist.destroy_process_group()
    torch.testing.assert_close(scores[1], scores[0], rtol=0, atol=0)
