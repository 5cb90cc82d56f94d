"""The Megatron engine on CPU workers (gloo; a single worker runs in this process) matches the
single-process HF fp32 reference.

Each layout checks, on one Policy: get_logprobs, get_topk_logits, evaluate, the per-step loss
and gradient norm of two AdamW steps, and the parameters after them (the same checks and
tolerances as test_policy_parallel.py for the DTensor engine). Under TP, with the output layer
tied to the embedding and split over the ranks, the chunked LM head equals the whole logits
(as test_policy_parallel checks for the DTensor engine). A frozen teacher under TP with a
padded vocabulary: test_full_vocab_engines.
"""

import pytest
import torch
from layout_runs import (
    LOGPROB_ATOL,
    MEGATRON,
    K,
    LayoutRuns,
    assert_chunked_equals_whole,
    check_run_against_reference,
)
from references import (
    load_reference,
    reference_logprobs,
    reference_topk,
)
from tiny_policies import (
    cpu_cluster,
    executor_for,
    frozen_topk,
    make_batch,
    policy_config,
    start_policy,
    train_after_resume,
)
from transformers import AutoConfig, AutoModelForCausalLM

from nemo_opd.distributed.worker_group import WorkerError
from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.policy import Policy

PACKING = {
    "sequence_packing__enabled": True,
    "sequence_packing__train_mb_tokens": 64,
    "sequence_packing__logprob_mb_tokens": 64,
    "sequence_packing__sequence_length_round": 1,
}

LAYOUTS = {
    "world1": ("tied", 1, {}),
    # Tied embeddings under tp, and activation checkpointing through Megatron's
    # tensor_parallel.checkpoint (the CPU shim's RNG-state patch).
    "tp2_ac": (
        "tied",
        2,
        {
            "megatron_cfg__tensor_model_parallel_size": 2,
            "megatron_cfg__activation_checkpointing": True,
        },
    ),
    "dp2": ("untied", 2, {}),
    "packed_cp2": ("tied", 2, {"megatron_cfg__context_parallel_size": 2, **PACKING}),
    # A vocabulary (301) that tp does not divide: padded to 512 inside the engine.
    "tp2_odd_vocab": ("odd_tied", 2, {"megatron_cfg__tensor_model_parallel_size": 2}),
}


def megatron_config(model_dir: str, **overrides):
    return policy_config(model_dir, **MEGATRON, **overrides)


@pytest.fixture(scope="module")
def runs(model_dirs):
    layouts = {name: (kind, n, {**MEGATRON, **o}) for name, (kind, n, o) in LAYOUTS.items()}
    return LayoutRuns(layouts, model_dirs, prefix="megatron_")


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_reference(layout, runs):
    run = runs.get(layout)
    check_run_against_reference(
        run, runs.config(layout), runs.model_dir(layout), f"megatron_{layout}"
    )


def test_chunked_equals_the_whole_logits(runs):
    assert_chunked_equals_whole(runs.get("tp2_odd_vocab"), runs.get("tp2_odd_vocab", False))


def test_checkpoint_loads_in_transformers_and_resumes_in_another_layout(model_dirs, tmp_path):
    """Saved at tp=2 with the odd vocabulary (padded to 512 inside the engine): from_pretrained
    loads the real shapes and gives the same log-probs; a world-size-1 Megatron engine and a
    world-size-1 DTensor engine (both padding to 384) resume with the same loss, gradient norm
    and lr as the tp=2 engine that kept going (the optimizer state is stored unsharded under HF
    names, with the real vocabulary)."""
    model = model_dirs["odd_untied"]
    vocab = AutoConfig.from_pretrained(model).vocab_size
    first = make_batch(4, k=K, seed=11, vocab=vocab)
    second = make_batch(4, k=K, seed=12, vocab=vocab)
    loss_fn = DistillationLossFn(implementation="torch")  # reverse KL, the default
    checkpoint = tmp_path / "step_1"

    cfg = megatron_config(model, megatron_cfg__tensor_model_parallel_size=2)
    policy = Policy(cfg, cpu_cluster(2), name="megatron_save", executor=executor_for(2))
    try:
        policy.train(first, loss_fn)
        saved_logprobs = policy.get_logprobs(second)
        policy.save(str(checkpoint))
        policy.offload()
        policy.onload()
        continued = policy.train(second, loss_fn)
    finally:
        policy.shutdown()

    hf = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    assert hf.lm_head.weight.shape[0] == hf.config.vocab_size == vocab
    hf_logprobs = reference_logprobs(hf, second)
    valid = torch.arange(hf_logprobs.shape[1]) < second["input_lengths"].unsqueeze(1) - 1
    assert (hf_logprobs - saved_logprobs).abs()[valid].max() < LOGPROB_ATOL

    # The same checkpoint resumes in either backend (the DTensor engine reads the optimizer
    # state Megatron's optimizer wrote).
    for backend, cfg in (
        ("megatron", megatron_config(model)),
        ("dtensor", policy_config(model)),
    ):
        again = train_after_resume(cfg, 1, str(checkpoint), second, loss_fn, step=1)
        for name in ("loss", "grad_norm", "lr"):
            torch.testing.assert_close(
                torch.tensor(again[name]),
                torch.tensor(continued[name]),
                rtol=1e-5,
                atol=0,
                msg=lambda m, backend=backend, name=name: f"{backend} resume, {name}: {m}",
            )


def test_bf16_on_cpu_scores_but_refuses_to_train(model_dirs):
    """megatron-core's linear layers restore only CUDA autocast in their backward: a bf16
    student is refused at build on CPU, naming the key; a bf16 frozen teacher scores."""
    batch = make_batch(3, teacher=False, seed=5)
    cfg = megatron_config(model_dirs["tied"], precision="bfloat16", optimizer=None)
    values, _ = frozen_topk(cfg, 1, batch, K)
    ref_values, _ = reference_topk(load_reference(model_dirs["tied"]), batch, K)
    valid = torch.arange(values.shape[1]) < batch["input_lengths"].unsqueeze(1)
    assert (values - ref_values).abs()[valid].max() < 0.1  # bf16 matmuls

    with pytest.raises(WorkerError, match=r"policy\.precision=bfloat16.*float32"):
        start_policy(megatron_config(model_dirs["tied"], precision="bfloat16"), 1)
