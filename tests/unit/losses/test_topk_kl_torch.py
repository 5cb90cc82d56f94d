"""topk_kl with the plain-torch implementation against the float64 brute force."""

import math

import pytest
import torch
from topk_kl_testing import (
    KL_SWEEP,
    TAIL_SWEEP,
    assert_matches_reference,
    brute_force_topk_kl,
    check_empty_slots,
    check_jsd_endpoints_are_the_kls,
    check_teacher_ruling_out_ids,
    check_zero_weight_rows_add_nothing,
    make_case,
    run_impl,
    run_reference,
)

from nemo_opd.losses import TopkKLParams, topk_kl, topk_kl_weighted_sum, topk_kl_with_stats
from nemo_opd.losses.topk_kl_torch import topk_kl_torch_forward

IMPL = "torch"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_matches_brute_force(kl_type, tail, temperature, dtype):
    logits, logprobs, ids = make_case(6, 401, 9, dtype=dtype, seed=1)
    grad_out = torch.linspace(-1.5, 2.0, 6)  # grad_output != 1, with a sign change
    assert_matches_reference(
        IMPL, logits, logprobs, ids, grad_out, kl_type=kl_type, tail=tail, temperature=temperature
    )


@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_float64_is_tight(kl_type, tail):
    logits, logprobs, ids = make_case(4, 1271, 13, dtype=torch.float64, seed=2)
    div, _, _ = assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail)
    assert div.dtype == torch.float64


@pytest.mark.parametrize(
    ("n", "vocab", "k"), [(3, 1271, 1), (5, 401, 1), (2, 1, 1), (7, 37, 36), (1, 2, 2)]
)
@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_odd_shapes(n, vocab, k, tail):
    logits, logprobs, ids = make_case(n, vocab, k, seed=3, teacher_scale=1.0)
    for kl_type in KL_SWEEP:
        assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail)


@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_bucket_with_k_equal_v_is_the_full_vocabulary_divergence(kl_type):
    vocab = 53
    logits, logprobs, ids = make_case(4, vocab, vocab, dtype=torch.float64, seed=4)
    div, _, grad = run_impl(IMPL, logits, logprobs, ids, kl_type=kl_type, temperature=0.7)
    # Textbook full-vocabulary divergences, written without buckets.
    z = logits.detach().clone().requires_grad_()
    log_q = torch.log_softmax(z / 0.7, dim=-1)
    log_p = torch.full_like(log_q, -math.inf).scatter(1, ids, logprobs.double())
    p, q = log_p.exp(), log_q.exp()
    fwd = torch.where(p > 0, p * (log_p - log_q), 0.0).sum(-1)
    rev = (q * (log_q - log_p)).sum(-1)
    log_m = torch.log(0.5 * p + 0.5 * q)
    full = {
        "forward": fwd,
        "reverse": rev,
        "mixed": 0.5 * fwd + 0.5 * rev,
        "jsd": 0.5 * (p * (log_p - log_m)).nan_to_num().sum(-1)
        + 0.5 * (q * (log_q - log_m)).sum(-1),
    }[kl_type]
    full.sum().backward()
    torch.testing.assert_close(div, full.detach(), atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(grad, z.grad, atol=1e-9, rtol=1e-9)


@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_extreme_logits(kl_type, tail):
    logits, logprobs, ids = make_case(5, 401, 9, seed=5)
    signs = torch.randint(-1, 2, logits.shape, generator=torch.Generator().manual_seed(0))
    logits = logits + 1e4 * signs
    logits[:, ids[0, 0]] = 1e4  # some teacher ids at the very top, others far below
    assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail)
    assert_matches_reference(IMPL, logits.bfloat16(), logprobs, ids, kl_type=kl_type, tail=tail)


@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_jsd_beta_endpoints_are_the_kls(tail):
    check_jsd_endpoints_are_the_kls(IMPL, tail)


@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_jsd_scaled_limits_of_the_reference(tail):
    """jsd / beta -> forward KL as beta -> 0 and jsd / (1 - beta) -> reverse KL as beta -> 1
    (the error is O(beta * chi^2), so mild distributions and a tiny beta, in float64)."""
    logits, logprobs, ids = make_case(4, 101, 101, dtype=torch.float64, seed=6, scale=0.5)
    small = 1e-7

    def div(**options):
        return brute_force_topk_kl(logits, logprobs, ids, tail=tail, **options)["divergence"]

    fwd, rev = div(kl_type="forward"), div(kl_type="reverse")
    torch.testing.assert_close(div(kl_type="jsd", jsd_beta=small) / small, fwd, rtol=1e-4, atol=0)
    torch.testing.assert_close(
        div(kl_type="jsd", jsd_beta=1 - small) / small, rev, rtol=1e-4, atol=0
    )


@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_mixed_weight_endpoints(tail):
    logits, logprobs, ids = make_case(4, 301, 7, seed=7)
    for weight, pure in ((1.0, "forward"), (0.0, "reverse")):
        mixed = run_impl(
            IMPL, logits, logprobs, ids, kl_type="mixed", mixed_kl_weight=weight, tail=tail
        )
        single = run_impl(IMPL, logits, logprobs, ids, kl_type=pure, tail=tail)
        torch.testing.assert_close(mixed[0], single[0], atol=0, rtol=0)
        torch.testing.assert_close(mixed[2], single[2], atol=1e-7, rtol=1e-6)


def test_the_kl_types_differ():
    """Guards against a sweep that passes because every kl_type computes the same thing."""
    logits, logprobs, ids = make_case(4, 301, 7, seed=8)
    values = [topk_kl(logits, logprobs, ids, kl_type=kl, implementation=IMPL) for kl in KL_SWEEP]
    for i in range(len(values)):
        for j in range(i):
            assert (values[i] - values[j]).abs().max() > 1e-3


@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_student_tail_below_the_floor(kl_type):
    """Q_tail underflows (ids outside S at -1e4) while the teacher keeps a large tail: the
    tail's log is floored at log(eps) and, as with a clamp, passes no gradient."""
    logits, logprobs, ids = make_case(4, 301, 7, seed=19, scale=1.0)
    logits = torch.full_like(logits, -1e4).scatter(1, ids, logits.gather(1, ids))
    ref, _ = run_reference(logits, logprobs, ids)
    assert (ref["teacher_tail_mass"] > 0.1).all() and (1 - ref["student_topk_mass"] < 1e-12).all()
    assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, temperature=0.7)


@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_tail_bucket_precise_when_the_top_k_holds_nearly_all_mass(kl_type):
    """Q_tail ~ 1e-10: a tail computed as 1 - sum_S q (or total - S part) in fp32 is all
    rounding error; it is summed directly over the ids outside S, so it stays precise."""
    logits, logprobs, ids = make_case(4, 401, 8, seed=9, scale=1.0)
    logits = logits.scatter_add(1, ids, torch.full(ids.shape, 28.0))
    logprobs = logprobs - torch.logsumexp(logprobs, dim=-1, keepdim=True) + math.log(0.95)
    ref, ref_grad = run_reference(logits, logprobs, ids, kl_type=kl_type)
    q_tail = 1 - ref["student_topk_mass"]
    assert (q_tail < 1e-9).all() and (q_tail > 1e-12).all()
    div, stats, grad = run_impl(IMPL, logits, logprobs, ids, kl_type=kl_type)
    torch.testing.assert_close(div.double(), ref["divergence"], rtol=1e-5, atol=1e-6)
    outside = torch.ones_like(grad, dtype=torch.bool).scatter(1, ids, False)
    # The gradient on the ids outside S, relative to its own (tiny) size.
    torch.testing.assert_close(grad[outside].double(), ref_grad[outside], rtol=1e-3, atol=1e-30)


@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_teacher_ruling_out_ids(kl_type, tail):
    check_teacher_ruling_out_ids(IMPL, kl_type, tail)


def test_top1_agreement_and_student_mass():
    logits, logprobs, ids = make_case(8, 97, 5, seed=10)
    top1 = ids.gather(1, logprobs.argmax(-1, keepdim=True)).squeeze(-1)
    logits[::2].scatter_(1, top1[::2, None], 50.0)  # even rows agree, odd rows mostly not
    _, stats = topk_kl_with_stats(logits, logprobs, ids, implementation=IMPL)
    expected = (logits.argmax(-1) == top1).float()
    assert expected[::2].eq(1).all() and expected.sum() < 8
    torch.testing.assert_close(stats.top1_agreement, expected)
    q = torch.softmax(logits.double(), -1).gather(1, ids).sum(-1)
    torch.testing.assert_close(stats.student_topk_mass.double(), q, atol=1e-6, rtol=1e-5)


def test_leading_dims_are_flattened():
    logits, logprobs, ids = make_case(6, 101, 4, seed=11)
    flat = run_impl(IMPL, logits, logprobs, ids)
    shaped = run_impl(
        IMPL, logits.view(2, 3, 101), logprobs.view(2, 3, 4), ids.view(2, 3, 4), kl_type="reverse"
    )
    assert shaped[0].shape == (2, 3) and shaped[1].top1_agreement.shape == (2, 3)
    torch.testing.assert_close(shaped[0].reshape(-1), flat[0])
    torch.testing.assert_close(shaped[2].reshape(6, 101), flat[2])


@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_chunking_does_not_change_the_result(tail):
    logits, logprobs, ids = make_case(7, 211, 6, seed=12)
    params = TopkKLParams(kl_type="mixed", tail=tail, temperature=0.8)
    outs = [
        topk_kl_torch_forward(logits, logprobs, ids, params, chunk_rows=rows)
        for rows in (None, 1, 3)
    ]
    for div, stats, grad in outs[1:]:
        torch.testing.assert_close(div, outs[0][0])
        torch.testing.assert_close(stats, outs[0][1])
        torch.testing.assert_close(grad, outs[0][2])


def test_no_grad_path_matches_and_allocates_no_gradient():
    logits, logprobs, ids = make_case(4, 101, 4, seed=13)
    with_grad = run_impl(IMPL, logits, logprobs, ids)[0]
    with torch.no_grad():
        z = logits.clone().requires_grad_()
        div = topk_kl(z, logprobs, ids, implementation=IMPL)
    assert not div.requires_grad
    torch.testing.assert_close(div, with_grad)
    div2, _, grad = topk_kl_torch_forward(logits, logprobs, ids, TopkKLParams(), need_grad=False)
    assert grad is None
    torch.testing.assert_close(div2, with_grad)


def test_renormalize_gives_no_gradient_outside_the_top_k():
    logits, logprobs, ids = make_case(4, 101, 6, seed=14)
    _, _, grad = run_impl(IMPL, logits, logprobs, ids, tail="renormalize", kl_type="jsd")
    outside = torch.ones_like(grad, dtype=torch.bool).scatter(1, ids, False)
    assert grad[outside].eq(0).all() and grad[~outside].abs().max() > 1e-4
    _, _, grad = run_impl(IMPL, logits, logprobs, ids, tail="bucket", kl_type="jsd")
    assert grad[outside].abs().max() > 1e-6


def test_inplace_grad_overwrites_the_logits_with_the_gradient():
    logits, logprobs, ids = make_case(4, 101, 6, seed=15)
    expected = run_impl(IMPL, logits, logprobs, ids, torch.arange(4.0))
    weight = logits.clone().requires_grad_()
    z = weight * 1.0  # a non-leaf, like the output of the lm_head
    div = topk_kl(z, logprobs, ids, implementation=IMPL, inplace_grad=True)
    torch.testing.assert_close(div, expected[0])
    (div * torch.arange(4.0)).sum().backward()
    torch.testing.assert_close(weight.grad, expected[2])


def test_inplace_grad_is_caught_when_the_logits_are_needed_elsewhere():
    logits, logprobs, ids = make_case(4, 101, 6, seed=16)
    x = logits.clone().requires_grad_()
    z = x.exp()  # exp saves its output for backward
    div = topk_kl(z.log(), logprobs, ids, implementation=IMPL)
    div.sum().backward()  # fine without inplace
    z = x.exp()
    div = topk_kl(z, logprobs, ids, implementation=IMPL, inplace_grad=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        div.sum().backward()


def test_second_backward_is_an_error():
    logits, logprobs, ids = make_case(3, 51, 4, seed=17)
    z = logits.clone().requires_grad_()
    div = topk_kl(z, logprobs, ids, implementation=IMPL)
    div.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="already consumed"):
        div.sum().backward()


def test_brute_force_reference_is_sane():
    """The reference itself: KL >= 0, zero when student == teacher over the full vocabulary."""
    logits, logprobs, ids = make_case(4, 64, 64, dtype=torch.float64, seed=18)
    teacher_logits = torch.full_like(logits, -math.inf).scatter(1, ids, logprobs.double())
    for kl_type in KL_SWEEP:
        out = brute_force_topk_kl(teacher_logits, logprobs, ids, kl_type=kl_type)
        assert out["divergence"].abs().max() < 1e-12
        out = brute_force_topk_kl(logits, logprobs, ids, kl_type=kl_type)
        assert (out["divergence"] > 0).all()


def test_weighted_sum_folds_the_weights_into_the_gradient():
    logits, logprobs, ids = make_case(6, 201, 5, seed=21)
    weights = torch.tensor([0.5, 0.0, 2.0, 1.0, 0.0, 0.25])
    jsd = TopkKLParams(kl_type="jsd")
    div, _, grad = run_impl(IMPL, logits, logprobs, ids, weights, kl_type="jsd")
    for scale in (1.0, 3.0):  # 1.0: the Triton backward skips its pass over the gradient
        z = logits.clone().requires_grad_()
        total, stats = topk_kl_weighted_sum(z, logprobs, ids, weights, params=jsd,
                                            implementation=IMPL)  # fmt: skip
        (scale * total).backward()
        torch.testing.assert_close(total, (div * weights).sum())
        torch.testing.assert_close(z.grad, scale * grad)
        assert stats.forward_kl.shape == (6,)
    with torch.no_grad():
        total, _ = topk_kl_weighted_sum(logits, logprobs, ids, weights, params=jsd,
                                        implementation=IMPL)  # fmt: skip
    torch.testing.assert_close(total, (div * weights).sum())


@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_weighted_sum_rows_of_weight_zero_add_nothing(tail):
    check_zero_weight_rows_add_nothing(IMPL, tail)


@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_empty_slots(kl_type, tail):
    check_empty_slots(IMPL, kl_type, tail)
