"""Checkpoints (HF layout, resume), the frozen teacher, offload/onload and failure modes."""

import os
import resource
import time

import pytest
import ray
import torch
from references import (
    load_reference,
    reference_logits,
    reference_logprobs,
    reference_topk,
    reference_train,
)
from tiny_policies import (
    ODD_VOCAB,
    cpu_cluster,
    frozen_topk,
    make_batch,
    policy_config,
    running_policy,
    start_policy,
)
from transformers import AutoModelForCausalLM

from nemo_opd.config import CheckpointingConfig
from nemo_opd.distributed.cluster import ClusterResourceError
from nemo_opd.distributed.worker_group import WorkerError
from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.policy import Policy
from nemo_opd.utils.checkpoint_manager import CheckpointManager

RAY_CPUS, RAY_CPUS_EXACT = 2, True  # test_too_many_workers_fails_at_setup reads "cluster has 2"
K = 5


def save_after_a_step(cfg, first: dict, second: dict, loss_fn, checkpoint) -> dict:
    """A Policy of `cfg` on 2 workers trains a step on `first`, saves `checkpoint` (twice:
    overwriting is atomic too), offloads and onloads, and trains a step on `second`:
    {"saved": its log-probs of `second` when saved, "continued": the last step's metrics}."""
    with running_policy(cfg, 2, name=f"saved_tp{cfg.tensor_parallel_size}") as policy:
        policy.train(first, loss_fn)
        saved_logprobs = policy.get_logprobs(second)
        policy.save(str(checkpoint))
        policy.save(str(checkpoint))
        policy.offload()
        policy.onload()
        torch.testing.assert_close(policy.get_logprobs(second), saved_logprobs, rtol=0, atol=0)
        return {"saved": saved_logprobs, "continued": policy.train(second, loss_fn)}


def test_save_loads_in_transformers_and_resumes(model_dirs, ray_session, tmp_path):
    """A checkpoint of the odd-vocabulary model (padded inside the engine), saved at tp=2 and
    at tp=1 (dp=2), is a plain Hugging Face checkpoint with the real shapes; one tp=2 Policy
    resumes each in turn (load restores weights, optimizer, scheduler, RNG and step, whatever
    the policy held): the tp=2 one exactly, the other within float rounding."""
    first = make_batch(4, k=K, seed=11, vocab=ODD_VOCAB)
    second = make_batch(4, k=K, seed=12, vocab=ODD_VOCAB)
    loss_fn = DistillationLossFn(implementation="torch")  # reverse KL, the default
    saved = {}
    for saved_tp in (2, 1):
        cfg = policy_config(model_dirs["odd_tied"], dtensor_cfg__tensor_parallel_size=saved_tp)
        checkpoint = tmp_path / f"tp{saved_tp}_step_1"
        saved[saved_tp] = save_after_a_step(cfg, first, second, loss_fn, checkpoint)
        saved[saved_tp]["checkpoint"] = checkpoint

        # The saved weights are a plain Hugging Face checkpoint.
        hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
        assert hf.config.vocab_size == ODD_VOCAB
        assert hf.get_input_embeddings().weight.shape[0] == ODD_VOCAB
        with torch.no_grad():
            logp = torch.log_softmax(reference_logits(hf, second), -1)
        targets = torch.roll(second["input_ids"], -1, dims=1)
        hf_logprobs = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        valid = torch.arange(hf_logprobs.shape[1]) < second["input_lengths"].unsqueeze(1) - 1
        assert (hf_logprobs - saved[saved_tp]["saved"]).abs()[valid].max() < 2e-5
        # Scoring between training steps must not disturb training: the step after the save
        # matches a plain HF backward from the saved weights.
        _, ref_norms, _, _ = reference_train(hf, second, loss_fn, cfg, steps_rows=4)
        torch.testing.assert_close(
            torch.tensor(saved[saved_tp]["continued"]["grad_norm"]),
            torch.tensor(ref_norms),
            rtol=1e-5,
            atol=0,
        )

    resumed_cfg = policy_config(model_dirs["odd_tied"], dtensor_cfg__tensor_parallel_size=2)
    with running_policy(resumed_cfg, 2, name="resumed_tp2") as resumed:
        for saved_tp, result in saved.items():
            resumed.load(str(result["checkpoint"]))
            assert resumed.step == 1
            again = resumed.train(second, loss_fn)
            rtol = 1e-6 if saved_tp == 2 else 1e-5  # another layout sums in another order
            for name in ("loss", "grad_norm", "lr"):
                torch.testing.assert_close(
                    torch.tensor(again[name]),
                    torch.tensor(result["continued"][name]),
                    rtol=rtol,
                    atol=0,
                    msg=lambda m, tp=saved_tp, name=name: f"saved at tp={tp}, {name}: {m}",
                )


def test_teacher_topk_equals_hf_topk(model_dirs, ray_session):
    """At tp=2 on the odd vocabulary (rank 1's shard is partly padding): the same values and
    ids as Hugging Face, every id a real one."""
    model = model_dirs["odd_untied"]
    cfg = policy_config(model, dtensor_cfg__tensor_parallel_size=2, optimizer=None)
    # 5 rows: not a multiple of dp is fine
    batch = make_batch(5, teacher=False, seed=4, vocab=ODD_VOCAB)
    values, indices = frozen_topk(cfg, 2, batch, K)
    ref_values, ref_indices = reference_topk(load_reference(model), batch, K)
    valid = torch.arange(values.shape[1]) < batch["input_lengths"].unsqueeze(1)
    assert values.dtype == torch.float32 and indices.dtype == torch.int32
    assert (values - ref_values).abs()[valid].max() < 2e-5
    assert torch.equal(indices.long()[valid], ref_indices[valid])


def test_too_many_workers_fails_at_setup(model_dirs, ray_session):
    cfg = policy_config(model_dirs["tied"])
    with pytest.raises(ClusterResourceError, match=r"4 workers need 4 CPU.*cluster has 2"):
        Policy(cfg, cpu_cluster(4))
    # Nothing was reserved: the check runs before any placement group or actor exists (the
    # previous test's placement group may still be being released, hence the wait).
    deadline = time.monotonic() + 20
    while ray.available_resources().get("CPU") != 2 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert ray.available_resources().get("CPU") == 2


@pytest.mark.parametrize("tp,cp", [(2, 2), (3, 1)])
def test_parallel_sizes_must_divide_world(model_dirs, ray_session, tp, cp):
    cfg = policy_config(
        model_dirs["tied"],
        dtensor_cfg__tensor_parallel_size=tp,
        dtensor_cfg__context_parallel_size=cp,
    )
    with pytest.raises(ValueError, match=r"tensor_parallel_size .* must divide the 2 workers"):
        Policy(cfg, cpu_cluster(2))


def test_evaluate_refuses_a_malformed_teacher(model_dirs):
    """evaluate checks the teacher's top-k where the loss grades, as train does: a NaN or an
    id outside the vocabulary stops the call with a message naming it (the loss is never
    run), instead of a NaN validation metric."""

    class NeverRun:
        input_fields = DistillationLossFn().input_fields

        def __call__(self, *args, **kwargs):
            raise AssertionError("the loss must not run on a malformed teacher")

    loss_fn = NeverRun()

    policy = start_policy(policy_config(model_dirs["odd_tied"]), 1, name="eval_checks")
    try:
        for key, value, message in (
            ("teacher_topk_logprobs", float("nan"), r"NaN or \+inf teacher_topk_logprobs"),
            (
                "teacher_topk_indices",
                ODD_VOCAB,
                rf"teacher_topk_indices outside \[0, {ODD_VOCAB}\)",
            ),
        ):
            batch = make_batch(2, k=K, seed=13, vocab=ODD_VOCAB)
            batch[key][1, 5, 0] = value  # position 5 of row 1 is graded
            with pytest.raises(WorkerError, match=message):
                policy.evaluate(batch, loss_fn)
    finally:
        policy.shutdown()


def test_a_save_that_fails_part_way_keeps_the_earlier_checkpoints(model_dirs, tmp_path):
    """A save stopped part-way by a real write limit (a file-size limit set on the live rank-0
    worker, which stops a write as a full disk would) fails naming the cause, leaves nothing
    of itself, and the earlier checkpoint still verifies and loads."""
    # A process of this machine (the processes executor): the limit is set on the worker's own
    # process, not on this one.
    cfg = policy_config(model_dirs["tied"])
    policy = start_policy(cfg, 1, name="save_fault", executor="processes")
    manager = CheckpointManager(CheckpointingConfig(checkpoint_dir=str(tmp_path)))

    def write(directory):
        policy.save(str(directory / "policy"))

    try:
        first = manager.save(1, write)
        files = manager.load_state(first)["files"]
        limit = files["policy/model.safetensors"]["bytes"] + 1  # the weights fit, the moments not
        assert files["policy/training_state.pt"]["bytes"] > limit
        pid = policy.workers.pids()[0]
        hard = resource.prlimit(pid, resource.RLIMIT_FSIZE)[1]
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (limit, hard))
        cause = rf"training_state.pt failed .*may not write files over {limit:,} bytes"
        with pytest.raises(
            WorkerError, match=rf"save_fault: worker rank 0 raised OSError: .*{cause}"
        ):
            manager.save(2, write)
        assert sorted(os.listdir(tmp_path)) == ["step_1"]
        manager.verify(first)
        policy.load(str(first / "policy"))  # reading is not limited
    finally:
        policy.shutdown()


def test_dead_worker_is_named(model_dirs, ray_session):
    policy = Policy(policy_config(model_dirs["tied"]), cpu_cluster(2))
    try:
        ray.kill(policy.workers.actors[1])
        with pytest.raises(WorkerError, match="worker rank 1 died"):
            policy.get_logprobs(make_batch(2, teacher=False))
    finally:
        policy.shutdown()


def test_bfloat16_compute_stays_close_to_fp32(model_dirs):
    cfg = policy_config(model_dirs["untied"], precision="bfloat16")
    batch = make_batch(4, k=K, seed=21)
    policy = start_policy(cfg, 1, name="bf16")
    try:
        logprobs = policy.get_logprobs(batch)
        metrics = policy.train(batch, DistillationLossFn(implementation="torch"))
        weights = policy.full_weights()
    finally:
        policy.shutdown()
    ref = reference_logprobs(load_reference(model_dirs["untied"]), batch)
    assert (logprobs - ref).abs().max() < 0.1  # bf16 activations on ~10-nat log-probs
    assert torch.isfinite(torch.tensor(metrics["loss"])).all()
    assert weights["lm_head.weight"].dtype == torch.bfloat16
