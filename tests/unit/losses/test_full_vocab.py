"""The exact full-vocabulary divergence against a float64 brute force written from the
definitions, against the top-k loss at k = V, and on vocabulary shards (2 gloo processes)."""

import math

import pytest
import torch
import torch.distributed as dist
from forked_ranks import run_ranks
from topk_kl_testing import run_reference

from nemo_opd.losses import PolicyGradientLossFn, TopkKLParams, topk_kl_weighted_sum
from nemo_opd.losses.divergence import EPS
from nemo_opd.losses.full_vocab import BLOCK_ELEMENTS, full_vocab_kl_weighted_sum
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.losses.teacher_logits import TeacherLogits

KL_TYPES = ("forward", "reverse", "mixed", "jsd")


def brute_force(z: torch.Tensor, zt: torch.Tensor, kl_type: str, w=0.3, beta=0.4, tau=1.0):
    """Per-row divergence in float64 from the textbook definitions (autograd for the
    gradient); ids whose student logit is -inf are left out on both sides."""
    log_q = torch.log_softmax(z.double() / tau, dim=-1)
    log_p = torch.log_softmax(zt.double() / tau, dim=-1)
    present = torch.isfinite(z)
    p = torch.where(present, log_p.exp(), 0.0)
    q = torch.where(present, log_q.exp(), 0.0)
    log_p = torch.where(present, log_p.clamp_min(math.log(EPS)), 0.0)
    log_q = torch.where(present, log_q, 0.0)
    forward = (p * (log_p - log_q)).sum(-1)
    reverse = (q * (log_q - log_p)).sum(-1)
    if kl_type == "forward":
        return forward
    if kl_type == "reverse":
        return reverse
    if kl_type == "mixed":
        return w * forward + (1 - w) * reverse
    m = beta * p + (1 - beta) * q
    log_m = torch.where(present, torch.log(m), 0.0)
    return beta * (p * (log_p - log_m)).sum(-1) + (1 - beta) * (q * (log_q - log_m)).sum(-1)


def case(n=6, vocab=333, seed=0, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    student = (torch.randn(n, vocab, generator=gen) * 3).to(dtype)
    teacher = torch.randn(n, vocab, generator=gen) * 3
    weights = torch.linspace(-0.5, 1.5, n)
    weights[2] = 0.0  # a row that must add nothing
    return student, teacher, weights


def ours(student, teacher, weights, **options):
    params = TopkKLParams(**options)
    z = student.detach().clone().requires_grad_()
    total, stats = full_vocab_kl_weighted_sum(z, teacher, weights, params=params)
    total.backward()
    return total, stats, z.grad


def reference(student, teacher, weights, kl_type, **options):
    z = student.detach().double().requires_grad_()
    div = brute_force(z, teacher, kl_type, **options)
    total = (torch.where(weights != 0, div * weights.double(), 0.0)).sum()
    total.backward()
    return total, div.detach(), z.grad


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_matches_the_float64_brute_force(kl_type, temperature):
    student, teacher, weights = case(seed=1)
    options = dict(mixed_kl_weight=0.3, jsd_beta=0.4, temperature=temperature)
    total, stats, grad = ours(student, teacher, weights, kl_type=kl_type, **options)
    want, _, want_grad = reference(
        student, teacher, weights, kl_type, w=0.3, beta=0.4, tau=temperature
    )
    torch.testing.assert_close(total.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), want_grad, rtol=1e-4, atol=1e-7)
    assert grad[2].eq(0).all()  # the row of weight 0
    forward = brute_force(student, teacher, "forward", tau=temperature)
    reverse = brute_force(student, teacher, "reverse", tau=temperature)
    torch.testing.assert_close(stats.forward_kl.double(), forward, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(stats.reverse_kl.double(), reverse, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_equals_the_top_k_loss_at_k_equal_v(kl_type):
    """With every id in the teacher's "top-k" the bucket loss is the full divergence."""
    student, teacher, weights = case(n=5, vocab=64, seed=2)
    options = dict(kl_type=kl_type, mixed_kl_weight=0.6, jsd_beta=0.25, temperature=0.9)
    total, stats, grad = ours(student, teacher, weights, **options)
    logprobs, ids = torch.log_softmax(teacher / 0.9, dim=-1).topk(64, dim=-1)
    z = student.detach().clone().requires_grad_()
    params = TopkKLParams(tail="bucket", **options)
    want, want_stats = topk_kl_weighted_sum(
        z, logprobs, ids, weights, params=params, implementation="torch"
    )
    want.backward()
    torch.testing.assert_close(total, want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad, z.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(stats.top1_agreement, want_stats.top1_agreement)


def test_blocks_padding_and_bf16():
    """Several row blocks, padded columns (-inf in both) that get no gradient, bf16 logits."""
    vocab = BLOCK_ELEMENTS // 3 + 5  # 3 rows per block: 7 rows span 3 blocks
    student, teacher, weights = case(n=7, vocab=vocab, seed=3, dtype=torch.bfloat16)
    student[:, -5:], teacher[:, -5:] = -math.inf, -math.inf
    total, _, grad = ours(student, teacher, weights, kl_type="reverse")
    want, _, want_grad = reference(student.float(), teacher, weights, "reverse")
    assert grad.dtype == torch.bfloat16 and torch.isfinite(grad).all()
    assert grad[:, -5:].eq(0).all()
    torch.testing.assert_close(total.double(), want, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad.double(), want_grad, rtol=2e-2, atol=1e-6)


def test_teacher_ruling_out_an_id_is_floored_not_nan():
    student, teacher, weights = case(seed=4)
    teacher[:, 7] = -math.inf  # the teacher gives id 7 no mass; the student does
    for kl_type in KL_TYPES:
        total, _, grad = ours(student, teacher, weights, kl_type=kl_type, mixed_kl_weight=0.3,
                              jsd_beta=0.4)  # fmt: skip
        want, _, want_grad = reference(student, teacher, weights, kl_type, w=0.3, beta=0.4)
        assert torch.isfinite(total) and torch.isfinite(grad).all(), kl_type
        torch.testing.assert_close(total.double(), want, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(grad.double(), want_grad, rtol=1e-4, atol=1e-7)


def test_refuses_mismatched_shapes():
    student, teacher, weights = case()
    params = TopkKLParams()
    with pytest.raises(ValueError, match="one shape"):
        full_vocab_kl_weighted_sum(student, teacher[:, :-1], weights, params=params)
    with pytest.raises(ValueError, match="positions' shape"):
        full_vocab_kl_weighted_sum(student, teacher, weights[:-1], params=params)


SPLIT, VOCAB = 150, 333  # uneven shards: [0, 150) and [150, 333)


def _worker(rank, init_file):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        student, teacher, weights = case(n=6, vocab=VOCAB, seed=5)
        student[0, :SPLIT], teacher[0, :SPLIT] = -math.inf, -math.inf  # a padding shard
        student[1, 200] = 30.0  # the student's max on shard 1
        lo, hi = (0, SPLIT) if rank == 0 else (SPLIT, VOCAB)
        for kl_type in KL_TYPES:
            params = TopkKLParams(kl_type=kl_type, temperature=0.8)
            full = ours(student, teacher, weights, kl_type=kl_type, temperature=0.8)
            z = student[:, lo:hi].clone().requires_grad_()
            total, stats = full_vocab_kl_weighted_sum(
                z, teacher[:, lo:hi], weights, params=params, tp_group=dist.group.WORLD
            )
            total.backward()
            torch.testing.assert_close(total, full[0], rtol=1e-5, atol=1e-6)
            for got, want in zip(stats, full[1], strict=True):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(z.grad, full[2][:, lo:hi], rtol=1e-4, atol=1e-7)
        mask = torch.ones(2, 3)
        for support in ("full", "student_topk"):
            loss_fn = FullVocabDistillationLossFn(
                params=TopkKLParams(kl_type="mixed", temperature=0.8), support=support, k=7,
                teacher_temperature=1.1, implementation="torch",
            )  # fmt: skip
            whole = student.view(2, 3, VOCAB).clone().requires_grad_()
            want, want_metrics = loss_fn(whole, loss_data(teacher.view(2, 3, VOCAB), mask), 6)
            want.backward()
            shard = student.view(2, 3, VOCAB)[..., lo:hi].clone().requires_grad_()
            data = loss_data(teacher.view(2, 3, VOCAB)[..., lo:hi], mask)
            loss, metrics = loss_fn(shard, data, 6, vocab_start=lo, tp_group=dist.group.WORLD)
            loss.backward()
            torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-6, msg=support)
            torch.testing.assert_close(metrics, want_metrics, rtol=1e-5, atol=1e-6, msg=support)
            torch.testing.assert_close(shard.grad, whole.grad[..., lo:hi], rtol=1e-4, atol=1e-7)
    finally:
        dist.destroy_process_group()


def test_vocabulary_shards_give_the_unsharded_answer(tmp_path):
    run_ranks(_worker, 2, str(tmp_path / "init"))


def loss_data(teacher, mask):
    return {"teacher_logits": teacher, "loss_mask": mask}


@pytest.mark.parametrize("kl_type", KL_TYPES)
def test_loss_fn_full_is_the_masked_mean_of_the_brute_force(kl_type):
    student, teacher, _ = case(n=8, vocab=97, seed=6)
    mask = torch.tensor([[1.0, 1, 0, 1], [0, 1, 1, 1]])
    params = TopkKLParams(kl_type=kl_type, mixed_kl_weight=0.3, jsd_beta=0.4, temperature=0.8)
    loss_fn = FullVocabDistillationLossFn(params=params, support="full", teacher_temperature=1.3)
    z = student.view(2, 4, 97).clone().requires_grad_()
    loss, metrics = loss_fn(z, loss_data(teacher.view(2, 4, 97), mask), 10)
    loss.backward()
    z64 = student.double().requires_grad_()
    # the brute force at two temperatures: the teacher's logits rescaled by 0.8 / 1.3
    div = brute_force(z64, teacher * (0.8 / 1.3), kl_type, w=0.3, beta=0.4, tau=0.8)
    want = (div * mask.reshape(-1).double()).sum() / 10
    want.backward()
    torch.testing.assert_close(loss.double(), want, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(z.grad.reshape(8, 97).double(), z64.grad, rtol=1e-4, atol=1e-8)
    assert metrics["num_valid_tokens"] == 6
    forward = brute_force(student, teacher * (0.8 / 1.3), "forward", tau=0.8)
    want_forward = (forward * mask.reshape(-1).double()).sum() / 10
    torch.testing.assert_close(metrics["forward_kl"].double(), want_forward, rtol=1e-5, atol=1e-7)


def test_loss_fn_student_topk_is_the_top_k_loss_on_the_students_ids():
    student, teacher, _ = case(n=8, vocab=97, seed=7)
    mask = torch.ones(2, 4)
    params = TopkKLParams(kl_type="reverse", temperature=0.9)
    loss_fn = FullVocabDistillationLossFn(
        params=params, support="student_topk", k=5, implementation="torch"
    )
    z = student.view(2, 4, 97).clone().requires_grad_()
    loss, metrics = loss_fn(z, loss_data(teacher.view(2, 4, 97), mask), 8)
    loss.backward()
    # independently: the student's 5 likeliest ids, the teacher's float64 log-probs there,
    # and the float64 brute force of the top-k loss (tail bucket) on them
    ids = student.double().topk(5, dim=-1).indices
    teacher_lp = torch.log_softmax(teacher.double() / 0.9, dim=-1).gather(-1, ids)
    ref, ref_grad = run_reference(
        student, teacher_lp, ids, torch.full((8,), 1 / 8), kl_type="reverse", temperature=0.9
    )
    torch.testing.assert_close(loss.double(), ref["divergence"].sum() / 8, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(z.grad.reshape(8, 97).double(), ref_grad, rtol=1e-4, atol=1e-8)
    tail = ref["teacher_tail_mass"].mean()
    torch.testing.assert_close(metrics["teacher_tail_mass"].double(), tail, rtol=1e-5, atol=1e-7)


def test_loss_fn_refuses_what_it_cannot_do():
    with pytest.raises(ValueError, match="support must be"):
        FullVocabDistillationLossFn(support="teacher_topk")
    with pytest.raises(ValueError, match="needs k"):
        FullVocabDistillationLossFn(support="student_topk")


def test_policy_gradient_loss_adds_the_full_vocabulary_term():
    """OPD as RL with the divergence term over every id: the policy-gradient loss plus
    topk_kl_coef x the full-vocabulary loss, its metrics under the term's prefix."""
    student, teacher, _ = case(n=8, vocab=97, seed=8)
    gen = torch.Generator().manual_seed(9)
    mask = torch.ones(2, 4)
    data = {
        "teacher_logits": teacher.view(2, 4, 97),
        "loss_mask": mask,
        "targets": torch.randint(0, 97, (2, 4), generator=gen),
        "old_logprobs": -torch.rand(2, 4, generator=gen),
        "advantages": torch.randn(2, 4, generator=gen),
    }
    full = FullVocabDistillationLossFn(params=TopkKLParams(kl_type="reverse"), support="full")
    plain = PolicyGradientLossFn(sampler_correction=False, is_cap=None)
    hybrid = PolicyGradientLossFn(
        sampler_correction=False, is_cap=None, topk_kl=full, topk_kl_coef=0.5
    )
    assert "teacher_hidden" in hybrid.input_fields  # the engine turns it into teacher_logits
    logits = student.view(2, 4, 97)
    loss, metrics = hybrid(logits, data, 8)
    pg_loss, _ = plain(logits, data, 8)
    full_loss, full_metrics = full(logits, data, 8)
    torch.testing.assert_close(loss, pg_loss + 0.5 * full_loss)
    torch.testing.assert_close(metrics["topk_forward_kl"], full_metrics["forward_kl"])


def test_teacher_logits_made_block_by_block_from_hidden_states():
    """TeacherLogits.from_hidden (what the engine hands the loss) gives the tensor's answer,
    for both supports, over several row blocks."""
    gen = torch.Generator().manual_seed(10)
    vocab, hidden_size = BLOCK_ELEMENTS // 4 + 3, 8  # 3 rows per block: 9 rows, 3 blocks
    hidden = torch.randn(1, 9, hidden_size, generator=gen)
    head = torch.randn(vocab, hidden_size, generator=gen)
    student = torch.randn(1, 9, vocab, generator=gen)
    mask = torch.ones(1, 9)
    for support in ("full", "student_topk"):
        loss_fn = FullVocabDistillationLossFn(support=support, k=3, implementation="torch")
        lazy = TeacherLogits.from_hidden(hidden, lambda rows: rows @ head.t(), vocab)
        eager = hidden @ head.t()
        got = loss_fn(student, {"teacher_logits": lazy, "loss_mask": mask}, 9)
        want = loss_fn(student, {"teacher_logits": eager, "loss_mask": mask}, 9)
        torch.testing.assert_close(got, want, msg=support)


@pytest.mark.parametrize(("slab_rows", "calls"), [(None, [9]), (6, [6, 3]), (5, [5, 5, 3])])
def test_the_teachers_head_runs_once_per_slab_not_per_block(monkeypatch, slab_rows, calls):
    """The loss walks 9 rows in blocks of 3; the teacher's head makes its logits a slab at a
    time: by default the whole chunk in one product; 6-row slabs hold two blocks each; a 5-row
    slab ends inside a block, whose rows the next slab makes from the block's start. The loss
    is the eager tensor's."""
    import nemo_opd.losses.teacher_logits as teacher_logits

    gen = torch.Generator().manual_seed(11)
    vocab, hidden_size = BLOCK_ELEMENTS // 4 + 3, 8  # 3 rows per block of the loss
    if slab_rows is not None:
        monkeypatch.setattr(teacher_logits, "SLAB_ELEMENTS", slab_rows * vocab + 1)
    hidden = torch.randn(1, 9, hidden_size, generator=gen)
    head = torch.randn(vocab, hidden_size, generator=gen)
    student = torch.randn(1, 9, vocab, generator=gen)
    mask = torch.ones(1, 9)
    made: list[int] = []

    def head_logits(rows: torch.Tensor) -> torch.Tensor:
        made.append(rows.shape[0])
        return rows @ head.t()

    loss_fn = FullVocabDistillationLossFn(support="full", implementation="torch")
    lazy = TeacherLogits.from_hidden(hidden, head_logits, vocab)
    got = loss_fn(student, {"teacher_logits": lazy, "loss_mask": mask}, 9)
    want = loss_fn(student, {"teacher_logits": hidden @ head.t(), "loss_mask": mask}, 9)
    torch.testing.assert_close(got, want)
    assert made == calls
