"""Every parallel layout on 2 or 4 CPU workers (gloo), and one worker in this process, matches
a single-process HF reference.

Each layout checks, on one Policy: get_logprobs, get_topk_logits (values; ids up to swaps of
near-ties), the per-step training loss of two optimizer steps of the top-k divergence, then two
of the policy-gradient loss (clipped, importance-weighted, with the top-k term added), and the
parameters after them.
The odd_* models have a vocabulary (301) that tensor parallelism does not divide: the engine
pads it, and everything it returns must still have the real vocabulary.
"""

import pytest
import torch
from references import (
    load_reference,
    reference_logits,
    reference_logprobs,
    reference_topk,
    reference_train,
)
from tiny_policies import make_batch, policy_config, start_policy

from nemo_opd.losses import (
    DistillationLossFn,
    PolicyGradientLossFn,
    TopkKLParams,
    build_loss_mask,
)

RAY_CPUS = 4  # logical: the 4-worker layouts run on a 2-core machine too
K = 4
LOGPROB_ATOL = 2e-5
LOSS_RTOL = 1e-4
# AdamW normalizes each update to about lr (1e-3) per element, so tiny gradient differences
# can move an element by a fraction of lr; a wrong update direction would move it by ~lr.
PARAM_ATOL = 1e-4

LAYOUTS = {
    "world1": ("tied", 1, {}),
    "tp2": ("tied", 2, {"dtensor_cfg__tensor_parallel_size": 2}),
    "tp2_untied_ac": (
        "untied",
        2,
        {"dtensor_cfg__tensor_parallel_size": 2, "dtensor_cfg__activation_checkpointing": True},
    ),
    "dp2": ("untied", 2, {}),
    "dp2_dynamic": (
        "tied",
        2,
        {
            "dynamic_batching__enabled": True,
            "dynamic_batching__train_mb_tokens": 48,
            "dynamic_batching__logprob_mb_tokens": 48,
            "dynamic_batching__sequence_length_round": 8,
        },
    ),
    "cp2": ("tied", 2, {"dtensor_cfg__context_parallel_size": 2}),
    "packed_dp2": (
        "untied",
        2,
        {
            "sequence_packing__enabled": True,
            "sequence_packing__train_mb_tokens": 48,
            "sequence_packing__logprob_mb_tokens": 48,
            "sequence_packing__sequence_length_round": 4,
        },
    ),
    "packed_cp2": (
        "tied",
        2,
        {
            "dtensor_cfg__context_parallel_size": 2,
            "sequence_packing__enabled": True,
            "sequence_packing__train_mb_tokens": 64,
            "sequence_packing__logprob_mb_tokens": 64,
            "sequence_packing__sequence_length_round": 1,
        },
    ),
    # policy.make_vocab_size_divisible_by 1: 302 rows, 151 per rank, the last one padding
    "tp2_odd_vocab": (
        "odd_tied",
        2,
        {"dtensor_cfg__tensor_parallel_size": 2, "make_vocab_size_divisible_by": 1},
    ),
    "tp2_cp2_odd_vocab": (
        "odd_tied",
        4,
        {"dtensor_cfg__tensor_parallel_size": 2, "dtensor_cfg__context_parallel_size": 2},
    ),
}


def assert_topk_close(values, indices, ref_values, ref_indices, lengths, atol):
    """Values equal within atol; ids equal except where neighbouring values nearly tie."""
    valid = torch.arange(values.shape[1]) < lengths.unsqueeze(1)
    diff = (values - ref_values).abs()[valid]
    assert diff.max() < atol, f"top-k values differ by {diff.max():.3g}"
    same = indices.long() == ref_indices
    gaps = torch.zeros_like(ref_values, dtype=torch.bool)
    near = (ref_values[..., 1:] - ref_values[..., :-1]).abs() < 1e-4
    gaps[..., 1:] |= near
    gaps[..., :-1] |= near
    bad = (~same & ~gaps)[valid]
    assert not bad.any(), f"{int(bad.sum())} top-k ids differ without a near-tie"


def check_layout_against_reference(cfg, model_dir: str, workers: int, layout: str) -> None:
    """One Policy of `cfg` on `workers` CPU workers (one: in this process) against the
    single-process HF fp32 reference of `model_dir`: get_logprobs, get_topk_logits, evaluate,
    the loss and gradient norm of two AdamW steps and the parameters after them (the Megatron
    tests use it too)."""
    reference = load_reference(model_dir)
    batch = make_batch(8, k=K, seed=3, vocab=reference.config.vocab_size)
    batch["sample_mask"][5] = 0.0
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")
    policy = start_policy(cfg, workers, name=layout)
    try:
        logprobs = policy.get_logprobs(batch)
        values, indices = policy.get_topk_logits(batch, K)
        evaluated = policy.evaluate(batch, loss_fn)
        policy.full_weights()  # as in the loop (refit, then train): gathering must not disturb
        metrics = policy.train(batch, loss_fn)
        pg_batch, pg_loss_fn = policy_gradient_case(batch, policy.get_logprobs(batch))
        pg_metrics = policy.train(pg_batch, pg_loss_fn)
        weights = policy.full_weights()
    finally:
        policy.shutdown()

    ref_logprobs = reference_logprobs(reference, batch)
    ref_values, ref_indices = reference_topk(reference, batch, K)
    logprob_err = (logprobs - ref_logprobs).abs().max()
    assert logprob_err < LOGPROB_ATOL, f"{layout}: logprobs differ by {logprob_err:.3g}"
    lengths = batch["input_lengths"]
    assert_topk_close(values, indices, ref_values, ref_indices, lengths, LOGPROB_ATOL)

    with torch.no_grad():
        count = build_loss_mask(batch["token_mask"], batch["sample_mask"]).sum()
        ref_eval, _ = loss_fn(reference_logits(reference, batch), batch, count)
    torch.testing.assert_close(
        torch.tensor(evaluated["loss"]), ref_eval.float(), rtol=LOSS_RTOL, atol=0.0
    )
    assert evaluated["global_valid_toks"] == float(count)

    ref_losses, ref_norms, ref_params, ref_optimizer = reference_train(
        reference, batch, loss_fn, cfg, cfg.train_global_batch_size
    )
    assert len(metrics["loss"]) == 2
    close = {"rtol": LOSS_RTOL, "atol": 0.0}
    torch.testing.assert_close(torch.tensor(metrics["loss"]), torch.tensor(ref_losses), **close)
    # The gradient norm is scale-sensitive (AdamW's update is not): it catches a gradient that
    # is averaged instead of summed over ranks, or counted twice.
    torch.testing.assert_close(torch.tensor(metrics["grad_norm"]), torch.tensor(ref_norms), **close)

    # The policy-gradient loss, on weights the top-k steps have moved from the old log-probs'.
    pg_batch["loss_mask"] = build_loss_mask(pg_batch["token_mask"], pg_batch["sample_mask"])
    pg_batch["targets"] = torch.roll(pg_batch["input_ids"], -1, dims=1)
    ref_pg_losses, ref_pg_norms, ref_params, _ = reference_train(
        reference, pg_batch, pg_loss_fn, cfg, cfg.train_global_batch_size, optimizer=ref_optimizer
    )
    torch.testing.assert_close(
        torch.tensor(pg_metrics["loss"]), torch.tensor(ref_pg_losses), **close
    )
    torch.testing.assert_close(
        torch.tensor(pg_metrics["grad_norm"]), torch.tensor(ref_pg_norms), **close
    )
    assert pg_metrics["clip_fraction"][0] > 0 and min(pg_metrics["ratio_min"]) < 1
    worst = 0.0
    for name, ref in ref_params.items():
        assert weights[name].shape == ref.shape, f"{layout}: {name} has shape {weights[name].shape}"
        err = (weights[name] - ref.detach()).abs().max()
        assert err < PARAM_ATOL, f"{layout}: {name} differs by {err:.3g} after 2 steps"
        worst = max(worst, float(err))
    loss_err = max(abs(a / b - 1) for a, b in zip(metrics["loss"], ref_losses, strict=True))
    print(
        f"\n{layout}: logprob err {float(logprob_err):.2g}, loss rel err {loss_err:.2g}, "
        f"param err {worst:.2g}"
    )
    ref_head = ref_params.get("lm_head.weight", ref_params["model.embed_tokens.weight"])
    torch.testing.assert_close(
        weights["lm_head.weight"], ref_head.detach(), atol=PARAM_ATOL, rtol=0
    )


def policy_gradient_case(batch: dict, old_logprobs: torch.Tensor) -> tuple[dict, object]:
    """The batch with the fields of a policy-gradient step (old log-probs from before the top-k
    steps, a sampler that disagrees a little, advantages of both signs) and a loss that clips
    from both sides, truncates the sampler weights and adds the top-k term."""
    gen = torch.Generator().manual_seed(11)
    shape = old_logprobs.shape
    pg_batch = dict(batch)
    pg_batch["old_logprobs"] = old_logprobs
    pg_batch["sampler_logprobs"] = old_logprobs + 0.3 * torch.randn(shape, generator=gen)
    pg_batch["advantages"] = torch.randn(shape, generator=gen)
    loss_fn = PolicyGradientLossFn(
        clip_eps_low=0.002,
        clip_eps_high=0.002,
        is_cap=1.2,
        temperature=0.9,
        topk_kl=DistillationLossFn(params=TopkKLParams(kl_type="forward"), implementation="torch"),
        topk_kl_coef=0.5,
    )
    return pg_batch, loss_fn


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_layout_matches_reference(layout, model_dirs, ray_session):
    kind, workers, overrides = LAYOUTS[layout]
    cfg = policy_config(model_dirs[kind], **overrides)
    check_layout_against_reference(cfg, model_dirs[kind], workers, layout)
