"""A generation engine that reads the DTensor student's own module (refit copies nothing) samples
what an engine holding a copy of the student's weights samples, in every layout a run in one
process builds: float32 (the plain module), bfloat16 (FSDP2 at world size 1, its parameters
DTensors, gathered for each call) and LoRA (adapters beside the frozen base, against the
merged weights a copying refit loads). After a call the module trains as it would have
without it: FSDP's state, the attention and the training mode are put back."""

import pytest
import torch
from vllm_testing import random_prompts

from nemo_opd.config import PolicyConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.generation.hf_worker import HfWorker
from nemo_opd.losses import DistillationLossFn, TopkKLParams
from nemo_opd.policy.engines.dtensor import DTensorEngine, FSDPModule

ATOL = {"float32": 1e-6, "bfloat16": 0.0}
LAYOUTS = {
    "float32": {"precision": "float32"},
    "bfloat16": {"precision": "bfloat16"},
    "lora": {
        "precision": "float32",
        "lora": {"enabled": True, "rank": 4, "alpha": 16, "target_modules": ["q_proj", "v_proj"]},
    },
}


def student_config(model_dir: str, **overrides) -> PolicyConfig:
    raw = {
        "model_name": model_dir,
        "tokenizer": {"name": model_dir},
        "train_global_batch_size": 4,
        "train_micro_batch_size": 2,
        "logprob_batch_size": 4,
        "max_total_sequence_length": 48,
        "optimizer": {"lr": 5e-2, "weight_decay": 0.0},
        **overrides,
    }
    return PolicyConfig.model_validate(raw)


def sampling() -> dict:
    return {"temperature": 1.0, "top_p": 1.0, "top_k": None}


def training_batch(seed: int) -> TensorBatch:
    """Four rows of random ids with random teacher top-k (vocabulary of the tiny test model)."""
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 256, (4, 24), generator=gen)
    logits = torch.randn(4, 24, 256, generator=gen) * 3
    values, indices = torch.log_softmax(logits, -1).topk(4, dim=-1)
    return TensorBatch(
        {
            "input_ids": ids,
            "input_lengths": torch.full((4,), 24),
            "token_mask": torch.ones(4, 24),
            "sample_mask": torch.ones(4),
            "teacher_topk_logprobs": values,
            "teacher_topk_indices": indices.to(torch.int32),
        }
    )


def copy_of(engine: DTensorEngine, precision: str, model_dir: str) -> HfWorker:
    """An engine holding its own copy, refit from the student as a copying refit does."""
    worker = HfWorker(model_dir, None, {"precision": precision, "max_batch_tokens": 4096})
    worker.update_weights(dict(engine.iter_weights()))
    return worker


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_shared_module_samples_what_a_refit_copy_samples(world1, model_dirs, layout):
    cfg = student_config(model_dirs["a"], **LAYOUTS[layout])
    engine = DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=4)
    assert isinstance(engine.model, FSDPModule) == (layout == "bfloat16")
    shared = HfWorker(None, None, {"precision": cfg.precision, "max_batch_tokens": 4096})
    shared.share_module(engine.model)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
    prompts, seeds = random_prompts(6, seed=21, min_len=2, max_len=16), list(range(6))
    for step in range(2):  # the initial weights, then the trained ones
        own = copy_of(engine, cfg.precision, model_dirs["a"])
        out = shared.generate(prompts, [12] * 6, sampling(), seeds)
        expected = own.generate(prompts, [12] * 6, sampling(), seeds)
        assert out.token_ids == expected.token_ids
        # The same values in other tensors: the CPU's matrix kernels may sum a padded batch in
        # another order (one row alone computes exactly the same), so within rounding; LoRA's
        # W x + s B A x against the merged (W + s B A) x rounds once more.
        atol = 1e-5 if layout == "lora" else ATOL[cfg.precision]
        torch.testing.assert_close(
            torch.tensor(sum(out.logprobs, [])),
            torch.tensor(sum(expected.logprobs, [])),
            atol=atol,
            rtol=0,
        )
        engine.train(training_batch(step), loss_fn, global_batch_size=4)


def test_a_call_leaves_the_fsdp_module_training_as_before(world1, model_dirs):
    """Two bf16 students take the same steps; one generates between them from its own module.
    Their losses and weights stay equal: the call resharded the parameters and put back the
    root's and the layers' reshard-after-forward, the attention and the training mode."""
    cfg = student_config(model_dirs["a"], precision="bfloat16")
    engines = [DTensorEngine(cfg, world1, torch.device("cpu"), total_steps=4) for _ in range(2)]
    shared = HfWorker(None, None, {"precision": "bfloat16", "max_batch_tokens": 4096})
    shared.share_module(engines[0].model)
    attention = engines[0].model.config._attn_implementation
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
    losses = [[], []]
    for step in range(3):
        engines[0].set_train_mode(True)
        shared.generate(random_prompts(4, seed=step), [8] * 4, sampling(), [1, 2, 3, 4])
        assert engines[0].model.training
        assert engines[0].model.config._attn_implementation == attention
        for index, engine in enumerate(engines):
            losses[index].append(engine.train(training_batch(step), loss_fn, 4)["loss"])
    assert losses[0] == losses[1]
    for mine, theirs in zip(
        engines[0].gather_weights().values(), engines[1].gather_weights().values(), strict=True
    ):
        assert torch.equal(mine, theirs)


def test_an_engine_without_a_model_says_what_it_waits_for():
    worker = HfWorker(None, None, {"precision": "float32", "max_batch_tokens": 4096})
    with pytest.raises(RuntimeError, match="has not been given it"):
        worker.generate([[1, 2]], [4], sampling(), [0])
