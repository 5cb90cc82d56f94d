"""PolicyGradientLossFn against a float64 autograd reference written here: every clipping
region, sampler weights, masks, global normalization, metrics, the hybrid with the top-k
loss, and the estimator's expectation against the exact sequence-level reverse-KL gradient."""

import math
from types import SimpleNamespace

import pytest
import torch
from topk_kl_testing import make_case

from nemo_opd.losses import (
    POLICY_GRADIENT_METRIC_NAMES,
    DistillationLossFn,
    PolicyGradientLossFn,
    TopkKLParams,
)

B, S, V, K = 3, 7, 53, 4
DEFAULTS = dict(
    clip_eps_low=0.2, clip_eps_high=0.2, sampler_correction=True, is_cap=2.0, temperature=1.0
)


def reference_loss(logits, data, global_valid_toks, **options):
    """float64: sum(loss_mask * w * pg) / max(global_valid_toks, 1), straight from the
    definition; differentiable in `logits` [B, S, V] (the full vocabulary)."""
    opts = {**DEFAULTS, **options}
    z = logits.double() / opts["temperature"]
    logp = torch.log_softmax(z, dim=-1).gather(-1, data["targets"].unsqueeze(-1)).squeeze(-1)
    old = data["old_logprobs"].double()
    adv = data["advantages"].double()
    ratio = torch.exp(logp - old)
    low, high = opts["clip_eps_low"], opts["clip_eps_high"]
    if low is None and high is None:
        clipped_ratio = ratio
    else:
        clipped_ratio = torch.clamp(
            ratio, None if low is None else 1 - low, None if high is None else 1 + high
        )
    pg = -torch.min(ratio * adv, clipped_ratio * adv)
    weight = torch.ones_like(old)
    if opts["sampler_correction"]:
        weight = torch.exp(old - data["sampler_logprobs"].double())
        if opts["is_cap"] is not None:
            weight = weight.clamp(max=opts["is_cap"])
    return (data["loss_mask"].double() * weight * pg).sum() / max(global_valid_toks, 1)


def make_batch(ratio, advantages, seed=0, temperature=1.0, log_weight_range=1.5):
    """Logits [B, S, V] and a data dict whose old log-probs put pi_theta / pi_old at `ratio`
    ([B, S] or a scalar) and whose sampler log-probs put pi_old / pi_sampler at
    exp(uniform(+-log_weight_range)). Row 1 is masked entirely."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S, V, generator=gen) * 2
    targets = torch.randint(0, V, (B, S), generator=gen)
    logp = torch.log_softmax(logits.double() / temperature, -1).gather(-1, targets[..., None])
    old = logp.squeeze(-1) - torch.log(torch.as_tensor(ratio, dtype=torch.float64))
    log_weight = (torch.rand(B, S, generator=gen, dtype=torch.float64) * 2 - 1) * log_weight_range
    loss_mask = (torch.rand(B, S, generator=gen) > 0.25).float()
    loss_mask[1] = 0.0
    data = {
        "targets": targets,
        "old_logprobs": old.float(),
        "sampler_logprobs": (old - log_weight).float(),
        "advantages": advantages.float(),
        "loss_mask": loss_mask,
    }
    return logits, data


def random_ratio(low, high, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return low + (high - low) * torch.rand(B, S, generator=gen, dtype=torch.float64)


def random_advantages(sign=0, seed=2):
    """Standard normal advantages; sign +1 / -1: |A| + 0.1 with that sign."""
    a = torch.randn(B, S, generator=torch.Generator().manual_seed(seed))
    return a if sign == 0 else sign * (a.abs() + 0.1)


def loss_and_grad(loss_fn, logits, data, global_valid_toks, grad_scale=0.7):
    z = logits.detach().clone().requires_grad_()
    loss, metrics = loss_fn(z, data, global_valid_toks)
    (loss * grad_scale).backward()
    return loss.detach(), metrics, z.grad


def reference_loss_and_grad(logits, data, global_valid_toks, grad_scale=0.7, **options):
    z = logits.detach().double().requires_grad_()
    loss = reference_loss(z, data, global_valid_toks, **options)
    (loss * grad_scale).backward()
    return loss.detach(), z.grad


WIDE = (math.exp(-1.0), math.exp(1.0))  # ratios in every clipping region
CASES = {
    # name: (options, ratio (low, high) or 1.0, advantage sign)
    "ratio_one": ({}, 1.0, 0),
    "unclipped": ({}, (0.85, 1.15), 0),
    "clipped_high": ({}, (1.3, 2.0), +1),
    "clipped_low": ({}, (0.3, 0.7), -1),
    "wide": ({}, WIDE, 0),
    "asymmetric": (dict(clip_eps_low=0.1, clip_eps_high=0.28), WIDE, 0),
    "upper_only": (dict(clip_eps_low=None, clip_eps_high=0.28), WIDE, 0),
    "lower_only": (dict(clip_eps_low=0.2, clip_eps_high=None), WIDE, 0),
    "no_clipping": (dict(clip_eps_low=None, clip_eps_high=None), WIDE, 0),
    "untruncated": (dict(is_cap=None), WIDE, 0),
    "heavily_truncated": (dict(is_cap=0.5), WIDE, 0),
    "no_sampler_correction": (dict(sampler_correction=False), WIDE, 0),
    "temperature": (dict(temperature=0.7), WIDE, 0),
}


def build_case(name, seed=0):
    options, ratio, sign = CASES[name]
    ratio = ratio if isinstance(ratio, float) else random_ratio(*ratio, seed=seed + 1)
    temperature = options.get("temperature", 1.0)
    logits, data = make_batch(ratio, random_advantages(sign, seed + 2), seed, temperature)
    if not options.get("sampler_correction", True):
        del data["sampler_logprobs"]  # not read: the loss must not need it
    return options, logits, data


@pytest.mark.parametrize("name", list(CASES))
def test_matches_float64_reference(name):
    options, logits, data = build_case(name)
    global_valid_toks = int(data["loss_mask"].sum()) + 3  # other ranks hold 3 more
    loss, metrics, grad = loss_and_grad(
        PolicyGradientLossFn(**options), logits, data, global_valid_toks
    )
    ref_loss, ref_grad = reference_loss_and_grad(logits, data, global_valid_toks, **options)
    torch.testing.assert_close(loss.double(), ref_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-7, rtol=1e-4)
    assert ref_grad[1].abs().max() == 0 and grad[1].abs().max() == 0  # the masked row
    assert set(metrics) == set(POLICY_GRADIENT_METRIC_NAMES)
    if name in ("clipped_high", "clipped_low"):
        # Every valid position is clipped: no gradient, and clip_fraction is their share.
        assert grad.abs().max() == 0
        valid = data["loss_mask"].sum()
        torch.testing.assert_close(metrics["clip_fraction"], valid / global_valid_toks)
    if name == "no_clipping" or name == "unclipped":
        assert metrics["clip_fraction"] == 0


def test_without_clipping_or_cap_is_the_importance_sampling_loss():
    """-(pi_theta / pi_sampler) * A per token: tinker-cookbook's importance_sampling loss."""
    options = dict(clip_eps_low=None, clip_eps_high=None, is_cap=None)
    logits, data = make_batch(random_ratio(*WIDE), random_advantages())
    loss, _, grad = loss_and_grad(PolicyGradientLossFn(**options), logits, data, 20)
    z = logits.double().requires_grad_()
    logp = torch.log_softmax(z, -1).gather(-1, data["targets"][..., None]).squeeze(-1)
    ratio = torch.exp(logp - data["sampler_logprobs"].double())
    expected = -(data["loss_mask"] * ratio * data["advantages"]).sum() / 20
    (expected * 0.7).backward()
    torch.testing.assert_close(loss.double(), expected.detach(), atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.double(), z.grad, atol=1e-7, rtol=1e-4)


def test_masked_garbage_changes_nothing():
    logits, data = make_batch(random_ratio(*WIDE), random_advantages())
    logits[..., V - 1] = -math.inf  # a padding column, which masked targets point at
    masked = data["loss_mask"] == 0
    garbage = dict(data)
    values = torch.tensor([math.nan, math.inf, -math.inf, 1e30])
    for i, name in enumerate(("old_logprobs", "sampler_logprobs", "advantages")):
        fill = values.roll(i).repeat(B * S)[: B * S].view(B, S)
        garbage[name] = torch.where(masked, fill, data[name])
    # Masked targets: the padding column, or an id outside the vocabulary.
    outside = torch.tensor([V - 1, -100]).repeat(B * S)[: B * S].view(B, S)
    garbage["targets"] = torch.where(masked, outside, data["targets"])
    loss_fn = PolicyGradientLossFn(is_cap=None)
    loss, metrics, grad = loss_and_grad(loss_fn, logits, garbage, 16)
    clean_loss, clean_metrics, clean_grad = loss_and_grad(loss_fn, logits, data, 16)
    assert torch.isfinite(loss) and torch.isfinite(grad).all()
    assert all(torch.isfinite(value) for value in metrics.values())
    torch.testing.assert_close(loss, clean_loss)
    torch.testing.assert_close(grad, clean_grad)
    torch.testing.assert_close(metrics, clean_metrics)
    ref_loss, ref_grad = reference_loss_and_grad(logits, data, 16, is_cap=None)
    torch.testing.assert_close(loss.double(), ref_loss, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, atol=1e-7, rtol=1e-4)


def test_microbatches_add_up_to_the_batch():
    logits, data = make_batch(random_ratio(*WIDE), random_advantages())
    loss_fn = PolicyGradientLossFn(clip_eps_high=0.28)
    total = int(data["loss_mask"].sum())
    full_loss, full_metrics, full_grad = loss_and_grad(loss_fn, logits, data, total)
    parts = [
        loss_and_grad(loss_fn, logits[rows], {k: v[rows] for k, v in data.items()}, total)
        for rows in (slice(0, 1), slice(1, B))
    ]
    torch.testing.assert_close(parts[0][0] + parts[1][0], full_loss)
    torch.testing.assert_close(torch.cat([parts[0][2], parts[1][2]]), full_grad)
    for name in POLICY_GRADIENT_METRIC_NAMES:
        a, b = parts[0][1][name], parts[1][1][name]
        combined = torch.minimum(a, b) if name.endswith("_min") else a + b
        combined = torch.maximum(a, b) if name.endswith("_max") else combined
        torch.testing.assert_close(combined, full_metrics[name], msg=name)
    assert full_metrics["num_valid_tokens"] == total


def test_metrics_by_hand():
    # Ratios, advantages and sampler weights chosen so every quantity is easy to count:
    #   r   1.0  1.5  0.5  1.1  0.5  1.5  | masked
    #   A   1    1    -1   -1   1    -1   |
    #   w   1    3    0.5  2.5  1    1    | (raw pi_old / pi_sampler; cap 2)
    # Clipped (clip(r) A < r A): position 1 (1.2 < 1.5) and 2 (-0.8 < -0.5): 2 of them.
    # pg = -min(rA, clip(r) A): -1, -1.2, 0.8, 1.1, -0.5, 1.5; times the capped w
    # (1, 2, 0.5, 2, 1, 1): -1 - 2.4 + 0.4 + 2.2 - 0.5 + 1.5 = 0.2.
    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(1, 7, 11, generator=gen)
    targets = torch.randint(0, 11, (1, 7), generator=gen)
    logp = torch.log_softmax(logits.double(), -1).gather(-1, targets[..., None]).squeeze(-1)
    ratio = torch.tensor([[1.0, 1.5, 0.5, 1.1, 0.5, 1.5, 7.0]], dtype=torch.float64)
    raw_weight = torch.tensor([[1.0, 3.0, 0.5, 2.5, 1.0, 1.0, 9.0]], dtype=torch.float64)
    old = logp - ratio.log()
    data = {
        "targets": targets,
        "old_logprobs": old.float(),
        "sampler_logprobs": (old - raw_weight.log()).float(),
        "advantages": torch.tensor([[1.0, 1.0, -1.0, -1.0, 1.0, -1.0, math.nan]]),
        "loss_mask": torch.tensor([[1.0, 1, 1, 1, 1, 1, 0]]),
    }
    loss, metrics = PolicyGradientLossFn(is_cap=2.0)(logits, data, 8)
    expected = {
        "loss": 0.2 / 8,
        "pg_loss": 0.2 / 8,
        "clip_fraction": 2 / 8,
        "ratio_mean": (1.0 + 1.5 + 0.5 + 1.1 + 0.5 + 1.5) / 8,
        "ratio_min": 0.5,
        "ratio_max": 1.5,
        "is_weight_mean": (1 + 2 + 0.5 + 2 + 1 + 1) / 8,
        "is_truncated_fraction": 2 / 8,
        "num_valid_tokens": 6.0,
    }
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        torch.testing.assert_close(metrics[name].item(), value, atol=1e-6, rtol=1e-6, msg=name)
        assert not metrics[name].requires_grad, name
    torch.testing.assert_close(loss.item(), 0.2 / 8, atol=1e-6, rtol=1e-6)
    # No valid position: the extremes are the identities of min and max, the rest 0.
    data["loss_mask"] = torch.zeros(1, 7)
    loss, metrics = PolicyGradientLossFn()(logits, data, 0)
    assert metrics["ratio_min"] == math.inf and metrics["ratio_max"] == -math.inf
    assert loss == 0 and metrics["num_valid_tokens"] == 0 and metrics["ratio_mean"] == 0


def teacher_topk(seed=3):
    _, logprobs, ids = make_case(B * S, V, K, seed=seed)
    return {
        "teacher_topk_logprobs": logprobs.view(B, S, K),
        "teacher_topk_indices": ids.view(B, S, K),
    }


def test_hybrid_adds_the_weighted_topk_loss():
    logits, data = make_batch(random_ratio(*WIDE), random_advantages(), temperature=0.8)
    data.update(teacher_topk())
    # The top-k term has its own temperature: it must receive the raw logits.
    distill = DistillationLossFn(
        params=TopkKLParams(kl_type="mixed", temperature=0.6), implementation="torch"
    )
    hybrid = PolicyGradientLossFn(temperature=0.8, topk_kl=distill, topk_kl_coef=0.3)
    loss, metrics, grad = loss_and_grad(hybrid, logits, data, 17)
    pg_loss, pg_metrics, pg_grad = loss_and_grad(
        PolicyGradientLossFn(temperature=0.8), logits, data, 17
    )
    kl_loss, kl_metrics, kl_grad = loss_and_grad(distill, logits, data, 17)
    torch.testing.assert_close(loss, pg_loss + 0.3 * kl_loss)
    torch.testing.assert_close(grad, pg_grad + 0.3 * kl_grad)
    torch.testing.assert_close(metrics["loss"], pg_loss + 0.3 * kl_loss)
    for name, value in pg_metrics.items():
        if name != "loss":
            torch.testing.assert_close(metrics[name], value, msg=name)
    torch.testing.assert_close(metrics["pg_loss"], pg_loss)
    for name, value in kl_metrics.items():
        torch.testing.assert_close(metrics["topk_" + name], value, msg=name)
    assert "topk_forward_kl" in metrics and "topk_loss" in metrics
    # The pg part is the reference's.
    ref_loss, _ = reference_loss_and_grad(logits, data, 17, temperature=0.8)
    torch.testing.assert_close(pg_loss.double(), ref_loss, atol=1e-6, rtol=1e-5)


def test_input_fields():
    assert DistillationLossFn().input_fields == (
        "loss_mask",
        "teacher_topk_logprobs",
        "teacher_topk_indices",
    )
    base = ("loss_mask", "targets", "old_logprobs", "advantages")
    assert PolicyGradientLossFn(sampler_correction=False).input_fields == base
    assert PolicyGradientLossFn().input_fields == (*base, "sampler_logprobs")
    hybrid = PolicyGradientLossFn(topk_kl=DistillationLossFn(), topk_kl_coef=0.5)
    assert hybrid.input_fields == (
        *base,
        "sampler_logprobs",
        "teacher_topk_logprobs",
        "teacher_topk_indices",
    )
    # A top-k loss given with coefficient 0 is left out, fields included.
    assert PolicyGradientLossFn(topk_kl=DistillationLossFn()).input_fields == (
        *base,
        "sampler_logprobs",
    )


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(clip_eps_low=-0.1), "clip_eps_low"),
        (dict(clip_eps_high=-1.0), "clip_eps_high"),
        (dict(clip_eps_high=math.nan), "clip_eps_high"),
        (dict(is_cap=0.0), "is_cap"),
        (dict(temperature=0.0), "temperature"),
        (dict(topk_kl_coef=-0.5, topk_kl=DistillationLossFn()), "topk_kl_coef"),
        (dict(topk_kl_coef=0.5), "no topk_kl"),
        (dict(topk_kl_coef=0.5, topk_kl=DistillationLossFn(inplace_grad=True)), "inplace"),
    ],
)
def test_rejects_bad_arguments(options, message):
    with pytest.raises(ValueError, match=message):
        PolicyGradientLossFn(**options)


def test_from_config():
    objective = SimpleNamespace(
        clip_eps_low=0.1, clip_eps_high=None, sampler_correction=False, is_cap=3.0, topk_kl_coef=0
    )
    loss_cfg = SimpleNamespace(
        kl_type="forward",
        mixed_kl_weight=0.5,
        jsd_beta=0.5,
        tail="bucket",
        temperature=0.9,
        implementation="torch",
    )
    loss_fn = PolicyGradientLossFn.from_config(objective, loss_cfg, temperature=0.7)
    assert (loss_fn.clip_eps_low, loss_fn.clip_eps_high) == (0.1, None)
    assert (loss_fn.sampler_correction, loss_fn.is_cap, loss_fn.temperature) == (False, 3.0, 0.7)
    assert loss_fn.topk_kl is None
    objective.topk_kl_coef = 0.25
    loss_fn = PolicyGradientLossFn.from_config(objective, loss_cfg, temperature=0.7)
    assert loss_fn.topk_kl_coef == 0.25
    assert loss_fn.topk_kl.params == TopkKLParams(kl_type="forward", temperature=0.9)
    assert loss_fn.topk_kl.implementation == "torch"


def test_gradient_estimates_the_sequence_reverse_kl_gradient():
    """Ratio 1 and advantages minus the reverse-KL return: the loss's gradient, averaged over
    sampled sequences, is the gradient of KL(student || teacher) over whole sequences."""
    vocab, steps, n = 4, 3, 200_000
    gen = torch.Generator().manual_seed(0)
    # Tabular policies: step t's logits given the previous token (id `vocab` = start).
    theta = torch.randn(steps, vocab + 1, vocab, generator=gen)
    teacher = torch.log_softmax(torch.randn(steps, vocab + 1, vocab, generator=gen) * 1.5, -1)
    step_ids = torch.arange(steps)

    def previous(tokens):
        start = torch.full_like(tokens[:, :1], vocab)
        return torch.cat([start, tokens[:, :-1]], dim=1)

    def token_logprobs(table, tokens):  # [n, steps]
        logits = table[step_ids, previous(tokens)]
        return torch.log_softmax(logits, -1).gather(-1, tokens[..., None]).squeeze(-1)

    def reverse_kl_return(student_table, tokens):  # sum over s >= t of k_s
        k = token_logprobs(student_table, tokens) - token_logprobs(
            teacher.to(student_table), tokens
        )
        return k.flip(1).cumsum(1).flip(1)

    # Monte Carlo: n sequences from the student, one loss call.
    tokens = torch.empty(n, steps, dtype=torch.long)
    prev = torch.full((n,), vocab)
    for t in range(steps):
        probs = torch.softmax(theta[t, prev], -1)
        tokens[:, t] = prev = torch.multinomial(probs, 1, generator=gen).squeeze(1)
    old = token_logprobs(theta, tokens)
    data = {
        "targets": tokens,
        "old_logprobs": old,
        "sampler_logprobs": old,
        "advantages": -reverse_kl_return(theta, tokens),
        "loss_mask": torch.ones(n, steps),
    }
    table = theta.clone().requires_grad_()
    loss, _ = PolicyGradientLossFn()(table[step_ids, previous(tokens)], data, n)
    loss.backward()
    estimate = table.grad.double()

    # Exact: enumerate all vocab**steps sequences in float64.
    every = torch.cartesian_prod(*[torch.arange(vocab)] * steps)
    exact_table = theta.double().requires_grad_()
    log_p = token_logprobs(exact_table, every).sum(1)
    log_q = token_logprobs(teacher.double(), every).sum(1)
    kl = (log_p.exp() * (log_p - log_q)).sum()
    (exact,) = torch.autograd.grad(kl, exact_table)
    # Each sequence's term of the estimator: grad of sum_t logp_t * (return_t, detached).
    returns = reverse_kl_return(theta.double(), every)

    def per_sequence(table_):
        return (token_logprobs(table_, every) * returns).sum(1)

    per_seq = torch.autograd.functional.jacobian(per_sequence, theta.double())
    p = log_p.detach().exp().view(-1, 1, 1, 1)
    torch.testing.assert_close((p * per_seq).sum(0), exact)  # the estimator is unbiased
    # The estimate is the mean of n i.i.d. per-sequence terms: by the central limit theorem
    # its error per entry is normal with sd sqrt(Var / n), Var known exactly from the
    # enumeration. 5 sd is exceeded with probability 6e-7 per entry (< 1e-4 over the 60
    # entries; the seed is fixed anyway); fp32 summation adds ~1e-6, covered by the atol.
    sd = ((p * (per_seq - exact) ** 2).sum(0) / n).sqrt()
    assert sd.max() < 0.01  # the bound is tight enough to mean something
    assert ((estimate - exact).abs() <= 5 * sd + 1e-5).all(), (estimate - exact).abs().max()
    # ... and the test can fail: each token's own k_t (gamma = 0) estimates something else.
    own_k = returns - torch.cat([returns[:, 1:], torch.zeros(len(every), 1)], dim=1)
    myopic = (p * torch.autograd.functional.jacobian(
        lambda table_: (token_logprobs(table_, every) * own_k).sum(1), theta.double()
    )).sum(0)  # fmt: skip
    assert ((myopic - exact).abs() > 10 * sd + 1e-5).any()
