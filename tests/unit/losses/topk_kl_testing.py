"""Test helpers for topk_kl: an independent float64 brute force, case builders, tolerances.

The brute force shares nothing with the package: it builds the full softmax, the bucket masses
by masking the vocabulary, and every divergence from its textbook definition; autograd gives
its gradients. (tests/unit/ops imports this module too.)
"""

import dataclasses
import math

import torch

from nemo_opd.losses import TopkKLParams, topk_kl_weighted_sum, topk_kl_with_stats

EPS = 1e-12


def brute_force_topk_kl(
    logits: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    teacher_indices: torch.Tensor,
    *,
    kl_type: str = "reverse",
    mixed_kl_weight: float = 0.5,
    jsd_beta: float = 0.5,
    tail: str = "bucket",
    temperature: float = 1.0,
) -> dict[str, torch.Tensor]:
    """logits [N, V] (full vocabulary), teacher [N, k] -> dict of [N] float64 tensors.

    Keys: divergence, forward_kl, reverse_kl, teacher_tail_mass, student_topk_mass.
    The divergence is differentiable w.r.t. `logits` if it requires grad.
    """
    z = logits.double() / temperature
    log_q_full = torch.log_softmax(z, dim=-1)
    a = teacher_logprobs.double()
    ids = teacher_indices.long()
    in_topk = torch.zeros_like(z, dtype=torch.bool).scatter(1, ids, True)
    q_topk_mass = log_q_full.exp().masked_fill(~in_topk, 0.0).sum(-1)
    teacher_tail = (1.0 - a.exp().sum(-1)).clamp_min(0.0)

    if tail == "bucket":
        q_tail = log_q_full.exp().masked_fill(in_topk, 0.0).sum(-1)
        p = torch.cat([a.exp(), teacher_tail[:, None]], dim=-1)
        q = torch.cat([log_q_full.gather(1, ids).exp(), q_tail[:, None]], dim=-1)
        log_q = torch.cat([log_q_full.gather(1, ids), q_tail.clamp_min(EPS).log()[:, None]], -1)
    else:
        p = torch.softmax(a, dim=-1)
        log_q = torch.log_softmax(z.gather(1, ids), dim=-1)
        q = log_q.exp()
    # Every teacher bucket's log is floored (an id the teacher rules out has P = 0); the
    # student's top-k logs are not, and neither are the weights P and Q.
    log_p = p.clamp_min(EPS).log()

    forward_kl = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)
    reverse_kl = torch.where(q > 0, q * (log_q - log_p), 0.0).sum(-1)
    if kl_type == "forward":
        div = forward_kl
    elif kl_type == "reverse":
        div = reverse_kl
    elif kl_type == "mixed":
        div = mixed_kl_weight * forward_kl + (1 - mixed_kl_weight) * reverse_kl
    elif kl_type == "jsd":
        beta = jsd_beta
        # log M = log(beta P + (1 - beta) Q), from the (floored) logs so it stays finite.
        log_m = torch.logaddexp(
            log_p + (math.log(beta) if beta > 0 else -math.inf),
            log_q + (math.log(1 - beta) if beta < 1 else -math.inf),
        )
        kl_p_m = torch.where(p > 0, p * (log_p - log_m), 0.0).sum(-1)
        kl_q_m = torch.where(q > 0, q * (log_q - log_m), 0.0).sum(-1)
        div = beta * kl_p_m + (1 - beta) * kl_q_m
    else:
        raise ValueError(kl_type)
    return {
        "divergence": div,
        "forward_kl": forward_kl,
        "reverse_kl": reverse_kl,
        "teacher_tail_mass": teacher_tail,
        "student_topk_mass": q_topk_mass,
    }


KL_SWEEP = ("forward", "reverse", "mixed", "jsd")
TAIL_SWEEP = ("bucket", "renormalize")

# (divergence atol, rtol; gradient atol, rtol) per logits dtype. The math is fp32 for every
# dtype and low-precision logits are exact in fp32, so only the stored gradient differs: bf16
# keeps 8 bits (the interpreter truncates instead of rounding), fp16 11 bits.
TOLERANCES = {
    torch.float64: (1e-10, 1e-9, 1e-11, 1e-9),
    torch.float32: (2e-5, 1e-4, 5e-6, 1e-4),
    torch.float16: (2e-5, 1e-4, 5e-6, 2e-3),
    torch.bfloat16: (2e-5, 1e-4, 2e-5, 1.6e-2),
}


def make_case(
    n: int,
    vocab: int,
    k: int,
    *,
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    scale: float = 3.0,
    teacher_scale: float | None = None,
):
    """Random student logits [n, vocab] and a teacher's top-k (log-probs over its full
    vocabulary, ids in random order within each row).

    Keep the teacher's tail mass well above 1e-7 where gradients are compared tightly: its
    fp32 log-probs fix P_tail only to ~1e-7 absolute, and the reverse KL's tail gradient is
    sensitive to log P_tail (a property of the inputs, shared by every fp32 implementation).
    """
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, vocab, generator=gen) * scale).to(dtype)
    teacher_scale = scale if teacher_scale is None else teacher_scale
    teacher = torch.randn(n, vocab, generator=gen, dtype=torch.float64) * teacher_scale
    teacher = torch.log_softmax(teacher, dim=-1)
    ids = teacher.topk(k, dim=-1).indices
    shuffle = torch.rand(n, k, generator=gen).argsort(dim=-1)
    ids = ids.gather(1, shuffle)
    teacher_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    return logits, teacher.gather(1, ids).to(teacher_dtype), ids


PARAM_NAMES = tuple(field.name for field in dataclasses.fields(TopkKLParams))


def split_params(options: dict) -> tuple[TopkKLParams, dict]:
    """(TopkKLParams from the divergence keywords in `options`, the other options)."""
    params = TopkKLParams(**{k: v for k, v in options.items() if k in PARAM_NAMES})
    return params, {k: v for k, v in options.items() if k not in PARAM_NAMES}


def run_impl(implementation, logits, logprobs, ids, grad_out=None, **options):
    """(divergence, stats, d(sum(grad_out * divergence))/d(logits)) from the package.
    `options`: the brute force's divergence keywords and topk_kl's other options."""
    params, others = split_params(options)
    z = logits.detach().clone().requires_grad_()
    div, stats = topk_kl_with_stats(
        z, logprobs, ids, params=params, implementation=implementation, **others
    )
    weights = torch.ones_like(div) if grad_out is None else grad_out
    (div * weights).sum().backward()
    return div.detach(), stats, z.grad


def run_reference(logits, logprobs, ids, grad_out=None, **options):
    """(brute-force outputs, gradient) in float64."""
    z = logits.detach().double().requires_grad_()
    out = brute_force_topk_kl(z, logprobs, ids, **options)
    weights = torch.ones_like(out["divergence"]) if grad_out is None else grad_out.double()
    (out["divergence"] * weights).sum().backward()
    return {key: value.detach() for key, value in out.items()}, z.grad


def assert_matches_reference(implementation, logits, logprobs, ids, grad_out=None, **options):
    """The package's divergence, statistics and gradient equal the brute force's."""
    div_atol, div_rtol, grad_atol, grad_rtol = TOLERANCES[logits.dtype]
    div, stats, grad = run_impl(implementation, logits, logprobs, ids, grad_out, **options)
    ref, ref_grad = run_reference(logits, logprobs, ids, grad_out, **options)
    close = torch.testing.assert_close
    close(div.double(), ref["divergence"], atol=div_atol, rtol=div_rtol)
    for name in ("forward_kl", "reverse_kl", "student_topk_mass", "teacher_tail_mass"):
        atol = max(div_atol, 1e-6) if name == "teacher_tail_mass" else div_atol
        close(getattr(stats, name).double(), ref[name], atol=atol, rtol=div_rtol, msg=name)
    assert grad.dtype == logits.dtype
    close(grad.double(), ref_grad, atol=grad_atol, rtol=grad_rtol)
    return div, stats, grad


def check_jsd_endpoints_are_the_kls(implementation, tail, device="cpu"):
    """jsd at beta 0 / 1 is, as TRL defines it, the forward / reverse KL (the brute force's jsd,
    from the textbook, vanishes there): the package's value and gradient equal the float64
    brute force's KL, and the package's own KL bit for bit. Just inside, the jsd is the
    textbook one."""
    logits, logprobs, ids = (t.to(device) for t in make_case(4, 301, 7, seed=6))
    for beta, kl_type in ((0.0, "forward"), (1.0, "reverse")):
        kl, _, kl_grad = assert_matches_reference(
            implementation, logits, logprobs, ids, kl_type=kl_type, tail=tail
        )
        jsd, _, jsd_grad = run_impl(
            implementation, logits, logprobs, ids, kl_type="jsd", jsd_beta=beta, tail=tail
        )
        assert torch.equal(jsd, kl) and torch.equal(jsd_grad, kl_grad)
    for beta in (1e-3, 1 - 1e-3):
        assert_matches_reference(
            implementation, logits, logprobs, ids, kl_type="jsd", jsd_beta=beta, tail=tail
        )


def check_teacher_ruling_out_ids(implementation, kl_type, tail, device="cpu"):
    """Teacher log-probs of -inf inside the top-k (row 0 one id, row 1 its top-1, row 2 all but
    one) or finite but below log(eps) (row 3) give the brute force's finite divergence and
    gradient: the teacher's bucket logs are floored at log(eps), its weights P are not."""
    logits, logprobs, ids = (t.to(device) for t in make_case(5, 301, 7, seed=22))
    logprobs[0, 1] = -math.inf
    logprobs[1, logprobs[1].argmax()] = -math.inf
    logprobs[2, 1:] = -math.inf
    logprobs[3, 0], logprobs[3, 2] = -math.inf, -40.0
    grad_out = torch.linspace(-1.0, 2.0, 5, device=device)
    div, _, grad = assert_matches_reference(
        implementation, logits, logprobs, ids, grad_out, kl_type=kl_type, tail=tail,
        temperature=0.8,
    )  # fmt: skip
    assert torch.isfinite(div).all() and torch.isfinite(grad).all()
    if kl_type == "reverse":  # the student's log at a ruled-out id is not floored: pushed down
        assert grad[0, ids[0, 1]] * grad_out[0] > 0


def check_zero_weight_rows_add_nothing(implementation, tail, device="cpu"):
    """topk_kl_weighted_sum: rows of weight 0 add nothing to the sum or to the gradient, even
    where their divergence is not finite: NaN teacher log-probs (row 1), a NaN logit (row 3),
    logits all -inf (row 4), a +inf logit (row 6). The rows of weight != 0 get the brute
    force's weighted gradient, whatever scalar backward brings."""
    logits, logprobs, ids = (t.to(device) for t in make_case(7, 201, 5, seed=24))
    logprobs[1, 2] = math.nan
    logits[3, 7], logits[4], logits[6, 11] = math.nan, -math.inf, math.inf
    weights = torch.tensor([0.5, 0.0, 2.0, 0.0, 0.0, 1.0, 0.0], device=device)
    live = weights != 0
    div_atol, div_rtol, grad_atol, grad_rtol = TOLERANCES[logits.dtype]
    for kl_type in ("forward", "reverse", "mixed", "jsd"):
        params = TopkKLParams(kl_type=kl_type, tail=tail)
        ref, ref_grad = run_reference(
            logits[live], logprobs[live], ids[live], weights[live], kl_type=kl_type, tail=tail
        )
        expected = (ref["divergence"] * weights[live].double()).sum()
        for scale in (1.0, 3.0):  # 1.0: the Triton backward skips its pass over the gradient
            z = logits.clone().requires_grad_()
            total, _ = topk_kl_weighted_sum(
                z, logprobs, ids, weights, params=params, implementation=implementation
            )
            (scale * total).backward()
            torch.testing.assert_close(total.double(), expected, atol=div_atol, rtol=div_rtol)
            assert z.grad[~live].eq(0).all(), f"{kl_type}: a row of weight 0 has a gradient"
            torch.testing.assert_close(
                z.grad[live].double(), scale * ref_grad, atol=grad_atol, rtol=grad_rtol
            )


def check_empty_slots(implementation, kl_type, tail, device="cpu"):
    """Empty slots (EMPTY_INDEX, log-prob -inf: row 0 one, row 1 all but one, row 2 all, row 3
    none) give the brute force over each row's filled slots alone, the empty slots' student
    mass in the tail; a row with no filled slot has a divergence of 0 and no gradient."""
    from nemo_opd.losses import EMPTY_INDEX

    logits, logprobs, ids = make_case(4, 301, 7, seed=31)
    filled = torch.ones_like(ids, dtype=torch.bool)
    filled[0, 2] = False
    filled[1, 1:] = False
    filled[2, :] = False
    empty_ids = ids.masked_fill(~filled, EMPTY_INDEX)
    empty_logprobs = logprobs.masked_fill(~filled, -math.inf)
    options = {"kl_type": kl_type, "tail": tail}
    args = (t.to(device) for t in (logits, empty_logprobs, empty_ids))
    div, stats, grad = run_impl(implementation, *args, **options)
    div_atol, div_rtol, grad_atol, grad_rtol = TOLERANCES[logits.dtype]
    close = torch.testing.assert_close
    for row in range(4):
        keep = filled[row]
        if not keep.any():
            assert float(div[row]) == 0.0 and not grad[row].abs().any()
            continue
        ref, ref_grad = run_reference(
            logits[row : row + 1], logprobs[row : row + 1, keep], ids[row : row + 1, keep],
            **options,
        )  # fmt: skip
        close(div[row : row + 1].double().cpu(), ref["divergence"], atol=div_atol, rtol=div_rtol)
        close(grad[row : row + 1].double().cpu(), ref_grad, atol=grad_atol, rtol=grad_rtol)
        for name in ("forward_kl", "reverse_kl", "student_topk_mass", "teacher_tail_mass"):
            value = getattr(stats, name)[row : row + 1].double().cpu()
            close(value, ref[name], atol=max(div_atol, 1e-6), rtol=div_rtol, msg=name)
