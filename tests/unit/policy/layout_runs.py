"""One run of a Policy in a parallel layout, and what the layout tests check on it: against the
single-process Hugging Face fp32 reference (test_policy_parallel, test_megatron_engine), and
the chunked LM head (policy.logits_chunk_tokens) against a run on the whole logits.

A run scores, evaluates and trains one test batch in the order the loop does (scores, refit,
two top-k steps, two policy-gradient steps, the weights); its answers are kept, so that each
module starts a layout's policy once however many of its tests read the answers (LayoutRuns).
"""

import torch
from references import (
    load_reference,
    reference_logits,
    reference_logprobs,
    reference_topk,
    reference_train,
)
from tiny_policies import ODD_VOCAB, VOCAB, make_batch, policy_config, start_policy

from nemo_opd.losses import (
    DistillationLossFn,
    PolicyGradientLossFn,
    TopkKLParams,
    build_loss_mask,
)
from nemo_opd.policy.policy import even_shards
from nemo_opd.policy.trained_positions import trained_positions
from nemo_opd.policy.worker import PolicyWorker, answers_for_its_replica

K = 4
LOGPROB_ATOL = 2e-5
LOSS_RTOL = 1e-4
# AdamW normalizes each update to about lr (1e-3) per element, so tiny gradient differences
# can move an element by a fraction of lr; a wrong update direction would move it by ~lr.
PARAM_ATOL = 1e-4
MEGATRON = {
    "dtensor_cfg__enabled": False,
    "megatron_cfg__enabled": True,
    "megatron_cfg__distributed_optimizer": False,
}


def layout_batch(vocab: int) -> dict:
    """The runs' batch: 8 ragged rows with a teacher's top-k, row 5 masked out."""
    batch = make_batch(8, k=K, seed=3, vocab=vocab)
    batch["sample_mask"][5] = 0.0
    return batch


def topk_loss() -> DistillationLossFn:
    return DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")


def run_layout(cfg, workers: int, name: str, vocab: int) -> dict:
    """What a fresh Policy of `cfg` on `workers` CPU workers (one: in this process) answers on
    layout_batch(vocab): log-probs and top-k at temperatures 1 and 0.9, the hidden states,
    score(trained_only, all three asked) at 0.9, evaluate, then (after a refit's full_weights,
    which must not disturb training) two top-k steps, two policy-gradient steps (old log-probs
    read after the top-k steps) and the weights after them."""
    batch = layout_batch(vocab)
    loss_fn = topk_loss()
    policy = start_policy(cfg, workers, name=name)
    try:
        run = {
            "batch": batch,
            "logprobs": policy.get_logprobs(batch),
            "topk": policy.get_topk_logits(batch, K),
            "logprobs_09": policy.get_logprobs(batch, temperature=0.9),
            "topk_09": policy.get_topk_logits(batch, K, temperature=0.9),
            "hidden": policy.get_hidden_states(batch),
            "trained_only": policy.score(
                batch, topk=K, temperature=0.9, logprobs=True, hidden=True, trained_only=True
            ),
            "sent": sent_by_each_rank(policy, batch),
            "evaluated": policy.evaluate(batch, loss_fn),
        }
        policy.full_weights()
        run["topk_steps"] = policy.train(batch, loss_fn)
        run["pg_batch"], pg_loss = policy_gradient_case(batch, policy.get_logprobs(batch))
        run["pg_steps"] = policy.train(run["pg_batch"], pg_loss)
        run["weights"] = policy.full_weights()
    finally:
        policy.shutdown()
    return run


def sent_by_each_rank(policy, batch: dict) -> list[tuple[bool, dict | None, int]]:
    """(answers for its replica, what it returned, its shard's trained positions) of every
    rank asked for score(trained_only) of its replica's shard as Policy.score asks: what
    would cross to the driver."""
    shards, _ = even_shards(batch, policy.dims.dp)
    ranks = range(policy.dims.world_size)
    shard_of = [dict(shards[policy.dims.coordinates(rank)["dp"]]) for rank in ranks]
    answers = policy.workers.run_each(
        PolicyWorker.score, lambda rank: (shard_of[rank], K, 0.9, True, True, True)
    )
    return [
        (
            answers_for_its_replica(policy.dims, rank),
            answers[rank],
            int(trained_positions(shard_of[rank]["token_mask"]).sum()),
        )
        for rank in ranks
    ]


class LayoutRuns:
    """A module's runs, each started on first use and kept: {layout: (model kind, workers,
    overrides)} of its layouts, model_dirs for the kinds."""

    def __init__(self, layouts: dict, model_dirs: dict, prefix: str = "") -> None:
        self.layouts, self.model_dirs, self.prefix = layouts, model_dirs, prefix
        self.runs: dict[tuple[str, bool], dict] = {}

    def config(self, layout: str, chunked: bool = True):
        kind, _, overrides = self.layouts[layout]
        chunking = {} if chunked else {"logits_chunk_tokens": None}
        return policy_config(self.model_dirs[kind], **overrides, **chunking)

    def model_dir(self, layout: str) -> str:
        return self.model_dirs[self.layouts[layout][0]]

    def get(self, layout: str, chunked: bool = True) -> dict:
        """The run of `layout` (chunked: with the tests' logits_chunk_tokens, else on the whole
        logits)."""
        if (layout, chunked) not in self.runs:
            kind, workers, _ = self.layouts[layout]
            vocab = ODD_VOCAB if kind.startswith("odd") else VOCAB
            name = f"{self.prefix}{layout}" + ("" if chunked else "_whole")
            cfg = self.config(layout, chunked)
            self.runs[layout, chunked] = run_layout(cfg, workers, name, vocab)
        return self.runs[layout, chunked]


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


def check_run_against_reference(run: dict, cfg, model_dir: str, layout: str) -> None:
    """A run against the single-process HF fp32 reference of `model_dir`: get_logprobs,
    get_topk_logits, evaluate, the loss and gradient norm of the two top-k and the two
    policy-gradient AdamW steps, and the parameters after them."""
    reference = load_reference(model_dir)
    batch, loss_fn = run["batch"], topk_loss()
    ref_logprobs = reference_logprobs(reference, batch)
    ref_values, ref_indices = reference_topk(reference, batch, K)
    logprob_err = (run["logprobs"] - ref_logprobs).abs().max()
    assert logprob_err < LOGPROB_ATOL, f"{layout}: logprobs differ by {logprob_err:.3g}"
    values, indices = run["topk"]
    lengths = batch["input_lengths"]
    assert_topk_close(values, indices, ref_values, ref_indices, lengths, LOGPROB_ATOL)

    evaluated = run["evaluated"]
    with torch.no_grad():
        count = build_loss_mask(batch["token_mask"], batch["sample_mask"]).sum()
        ref_eval, _ = loss_fn(reference_logits(reference, batch), batch, count)
    torch.testing.assert_close(
        torch.tensor(evaluated["loss"]), ref_eval.float(), rtol=LOSS_RTOL, atol=0.0
    )
    assert evaluated["global_valid_toks"] == float(count)

    metrics = run["topk_steps"]
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
    pg_batch, pg_metrics = dict(run["pg_batch"]), run["pg_steps"]
    pg_batch["loss_mask"] = build_loss_mask(pg_batch["token_mask"], pg_batch["sample_mask"])
    pg_batch["targets"] = torch.roll(pg_batch["input_ids"], -1, dims=1)
    _, pg_loss_fn = policy_gradient_case(batch, pg_batch["old_logprobs"])
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
    weights, worst = run["weights"], 0.0
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


def assert_chunked_equals_whole(chunked: dict, whole: dict) -> None:
    """The chunked head's run equals the whole logits' to fp32 noise: top-k (ids exactly),
    log-probs, score(trained_only), the steps' losses and gradient norms, the weights."""
    close = {"rtol": 1e-5, "atol": 1e-6}
    for name in ("topk", "topk_09"):
        torch.testing.assert_close(chunked[name][0], whole[name][0], **close)
        assert torch.equal(chunked[name][1], whole[name][1]), name
    for name in ("logprobs", "logprobs_09"):
        torch.testing.assert_close(chunked[name], whole[name], **close)
    for run in (chunked, whole):
        assert_trained_only_scores(run)
    for steps in ("topk_steps", "pg_steps"):
        for metric in ("loss", "grad_norm"):
            got = torch.tensor(chunked[steps][metric])
            torch.testing.assert_close(got, torch.tensor(whole[steps][metric]), **close)
    assert chunked["weights"].keys() == whole["weights"].keys()
    for name, weight in chunked["weights"].items():
        # AdamW's first steps move every element by about lr: noise in a gradient's last bits
        # can move one by a fraction of that, a wrong gradient by all of it.
        torch.testing.assert_close(weight, whole["weights"][name], rtol=0, atol=1e-5)


def assert_trained_only_scores(run: dict) -> None:
    """score(trained_only=True) is score's top-k, log-probs and hidden states where the next
    token is trained (token_mask[t + 1]) and 0 elsewhere, however the workers sent them."""
    batch = run["batch"]
    scored = build_loss_mask(batch["token_mask"]) != 0
    assert 0 < scored.sum() < (batch["input_ids"] != 0).sum()  # prompts are left out
    values, indices = run["topk_09"]
    trained = run["trained_only"]
    close = {"rtol": 1e-5, "atol": 1e-6}  # the head's product over fewer rows: fp32 noise
    torch.testing.assert_close(trained["topk_logprobs"], values * scored.unsqueeze(-1), **close)
    assert torch.equal(trained["topk_indices"], indices * scored.unsqueeze(-1))
    torch.testing.assert_close(trained["logprobs"], run["logprobs_09"] * scored, **close)
    hidden = run["hidden"] * scored.unsqueeze(-1)
    torch.testing.assert_close(trained["hidden_states"], hidden, rtol=0, atol=0)
    for answers, sent, trained_count in run["sent"]:
        if not answers:
            assert sent is None  # the driver reads another rank's: nothing crosses
            continue
        assert sent["topk_logprobs"].shape == (trained_count, K)
        assert sent["logprobs"].shape == (trained_count,)
        assert sent["hidden_states"].shape[0] == trained_count
