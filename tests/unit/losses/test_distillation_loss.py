"""DistillationLossFn: alignment, global normalization, packing, metrics, configuration."""

import math
from types import SimpleNamespace

import pytest
import torch
from topk_kl_testing import make_case

from nemo_opd.losses import (
    METRIC_NAMES,
    DistillationLossFn,
    TopkKLParams,
    build_loss_mask,
    topk_kl,
)

B, S, V, K = 4, 6, 97, 5


def make_batch(seed=0, dtype=torch.float32):
    logits, logprobs, ids = make_case(B * S, V, K, dtype=dtype, seed=seed)
    gen = torch.Generator().manual_seed(seed)
    token_mask = (torch.rand(B, S, generator=gen) > 0.3).long()
    data = {
        "teacher_topk_logprobs": logprobs.view(B, S, K),
        "teacher_topk_indices": ids.view(B, S, K),
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0, 0.0, 1.0]),
    }
    return logits.view(B, S, V), data


def loss_and_grad(loss_fn, logits, data, global_valid_toks):
    z = logits.detach().clone().requires_grad_()
    loss, metrics = loss_fn(z, data, global_valid_toks)
    loss.backward()
    return loss.detach(), metrics, z.grad


def slice_data(data, rows):
    return {key: value[rows] for key, value in data.items()}


def test_build_loss_mask_alignment():
    token_mask = torch.tensor([[0, 0, 1, 1, 1, 0], [0, 1, 1, 0, 1, 1]])
    expected = torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 0, 1, 1, 0]], dtype=torch.float32)
    torch.testing.assert_close(build_loss_mask(token_mask), expected)
    sample_mask = torch.tensor([1, 0])
    torch.testing.assert_close(build_loss_mask(token_mask, sample_mask)[1], torch.zeros(6))
    # Two packed sequences per row in the flattened stream: [0, 4) [4, 6) | [6, 9) [9, 12).
    cu_seqlens = torch.tensor([0, 4, 6, 9, 12])
    packed = build_loss_mask(torch.ones(2, 6, dtype=torch.long), cu_seqlens=cu_seqlens)
    expected = torch.tensor([[1, 1, 1, 0, 1, 0], [1, 1, 0, 1, 1, 0]], dtype=torch.float32)
    torch.testing.assert_close(packed, expected)
    with_empty = torch.tensor([0, 0, 4, 4, 6, 9, 12])  # zero-length sequences change nothing
    torch.testing.assert_close(
        build_loss_mask(torch.ones(2, 6, dtype=torch.long), cu_seqlens=with_empty), expected
    )


def test_loss_is_the_masked_sum_over_the_global_count():
    logits, data = make_batch()
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="forward"), implementation="torch")
    loss, metrics, _ = loss_and_grad(loss_fn, logits, data, 1000)
    div = topk_kl(
        logits, data["teacher_topk_logprobs"], data["teacher_topk_indices"], kl_type="forward"
    )
    mask = build_loss_mask(data["token_mask"], data["sample_mask"])
    torch.testing.assert_close(loss, (div * mask).sum() / 1000)
    torch.testing.assert_close(metrics["num_valid_tokens"], mask.sum())
    # Position t is graded by token t + 1: a mask on the logits' own position would differ.
    unshifted = data["token_mask"] * data["sample_mask"][:, None]
    assert not torch.allclose(loss, (div * unshifted).sum() / 1000)


@pytest.mark.parametrize("kl_type", ["reverse", "jsd"])
def test_microbatches_and_data_parallel_ranks_add_up_to_the_batch(kl_type):
    logits, data = make_batch(seed=1)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type=kl_type, temperature=0.7))
    n_valid = build_loss_mask(data["token_mask"], data["sample_mask"]).sum()
    loss, metrics, grad = loss_and_grad(loss_fn, logits, data, n_valid)
    # 2 data-parallel ranks x 2 microbatches of one sample each, all normalized by the same
    # global count, summed (as gradient accumulation and the dp all-reduce do).
    total_loss, total_metrics, grads = 0.0, dict.fromkeys(METRIC_NAMES, 0.0), []
    for rank_rows in (slice(0, 2), slice(2, 4)):
        for micro in range(rank_rows.start, rank_rows.stop):
            rows = slice(micro, micro + 1)
            part = loss_and_grad(loss_fn, logits[rows], slice_data(data, rows), n_valid)
            total_loss = total_loss + part[0]
            total_metrics = {k: total_metrics[k] + part[1][k] for k in METRIC_NAMES}
            grads.append(part[2])
    torch.testing.assert_close(total_loss, loss)
    torch.testing.assert_close(torch.cat(grads), grad)
    for name in METRIC_NAMES:
        torch.testing.assert_close(total_metrics[name], metrics[name], msg=name)


def test_packed_rows_equal_unpacked_rows():
    lengths = (5, 7)
    logits, logprobs, ids = make_case(sum(lengths), V, K, seed=2)
    token_mask = torch.tensor([0, 0, 1, 1, 1, 0, 0, 0, 1, 1, 1, 1])
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"))
    packed = {
        "teacher_topk_logprobs": logprobs[None],
        "teacher_topk_indices": ids[None],
        "token_mask": token_mask[None],
        "cu_seqlens": torch.tensor([0, 5, 12]),
    }
    # Unpacked: one sequence per row, the first right-padded with garbage to length 7.
    pad = 2
    unpacked_logits = torch.zeros(2, 7, V)
    unpacked_logits[0, :5], unpacked_logits[1] = logits[:5], logits[5:]
    unpacked_logits[0, 5:] = 100.0
    garbage_ids = torch.zeros(pad, K, dtype=ids.dtype)  # duplicates: never looked at
    unpacked = {
        "teacher_topk_logprobs": torch.stack(
            [torch.cat([logprobs[:5], torch.full((pad, K), math.nan)]), logprobs[5:]]
        ),
        "teacher_topk_indices": torch.stack([torch.cat([ids[:5], garbage_ids]), ids[5:]]),
        "token_mask": torch.stack([torch.cat([token_mask[:5], torch.zeros(pad).long()]),
                                   token_mask[5:]]),
    }  # fmt: skip
    count = build_loss_mask(packed["token_mask"], cu_seqlens=packed["cu_seqlens"]).sum()
    assert count == build_loss_mask(unpacked["token_mask"]).sum() == 7
    p_loss, p_metrics, p_grad = loss_and_grad(loss_fn, logits[None], packed, count)
    u_loss, u_metrics, u_grad = loss_and_grad(loss_fn, unpacked_logits, unpacked, count)
    torch.testing.assert_close(p_loss, u_loss)
    torch.testing.assert_close(p_metrics, u_metrics)
    torch.testing.assert_close(p_grad[0, :5], u_grad[0, :5])
    torch.testing.assert_close(p_grad[0, 5:], u_grad[1])
    assert p_grad[0, 4].eq(0).all()  # the boundary position grades nothing
    assert torch.isfinite(u_grad).all() and u_grad[0, 5:].eq(0).all()


def test_aligned_loss_mask_is_used_as_given():
    logits, data = make_batch(seed=3)
    loss_fn = DistillationLossFn()
    expected = loss_and_grad(loss_fn, logits, data, 17)
    aligned = dict(data)
    aligned["loss_mask"] = build_loss_mask(data.pop("token_mask"), data.pop("sample_mask"))
    aligned.pop("token_mask")
    aligned.pop("sample_mask")
    got = loss_and_grad(loss_fn, logits, aligned, 17)
    torch.testing.assert_close(got[0], expected[0])
    torch.testing.assert_close(got[2], expected[2])


def test_all_masked_batch_gives_zero_without_nans():
    logits, data = make_batch(seed=4)
    data["sample_mask"] = torch.zeros(B)
    data["teacher_topk_logprobs"] = torch.full_like(data["teacher_topk_logprobs"], math.nan)
    loss, metrics, grad = loss_and_grad(DistillationLossFn(), logits, data, 0)
    assert loss == 0 and grad.eq(0).all()
    assert all(torch.isfinite(value) and value == 0 for value in metrics.values())


def test_metrics_are_sane():
    logits, data = make_batch(seed=5)
    data["sample_mask"] = torch.ones(B)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="forward", tail="bucket"))
    n_valid = build_loss_mask(data["token_mask"]).sum()
    loss, metrics, _ = loss_and_grad(loss_fn, logits, data, n_valid)
    assert set(metrics) == set(METRIC_NAMES)
    assert all(not value.requires_grad for value in metrics.values())
    torch.testing.assert_close(metrics["loss"], loss)
    torch.testing.assert_close(metrics["forward_kl"], loss)  # kl_type forward
    assert metrics["reverse_kl"] > 0 and metrics["forward_kl"] > 0
    for name in ("teacher_tail_mass", "student_topk_mass", "top1_agreement"):
        assert 0 <= metrics[name] <= 1, name
    # A student that copies the teacher's buckets (its tail mass spread evenly outside the
    # top-k) agrees with it and has zero divergence.
    logprobs = data["teacher_topk_logprobs"]
    tail = torch.log1p(-logprobs.exp().sum(-1, keepdim=True)) - math.log(V - K)
    teacher_like = tail.expand(B, S, V).scatter(-1, data["teacher_topk_indices"], logprobs)
    _, metrics, _ = loss_and_grad(loss_fn, teacher_like, data, n_valid)
    torch.testing.assert_close(metrics["top1_agreement"], torch.tensor(1.0))
    assert metrics["forward_kl"].abs() < 1e-5 and metrics["reverse_kl"].abs() < 1e-5
    torch.testing.assert_close(
        metrics["student_topk_mass"], 1 - metrics["teacher_tail_mass"], atol=1e-5, rtol=0
    )


def test_configuration_from_a_config_section_or_params():
    from nemo_opd.config import LossConfig

    fields = dict(kl_type="jsd", jsd_beta=0.3, tail="renormalize", temperature=0.5)
    cfg = LossConfig(**fields, implementation="torch")
    expected = TopkKLParams(**fields)
    for loss_fn in (
        DistillationLossFn.from_config(cfg),
        DistillationLossFn.from_config(SimpleNamespace(**cfg.model_dump())),
        DistillationLossFn(params=expected, implementation="torch"),
    ):
        assert loss_fn.params == expected and loss_fn.implementation == "torch"
    loss_fn = DistillationLossFn.from_config(cfg, inplace_grad=True, validate_inputs=True)
    assert loss_fn.inplace_grad and loss_fn.validate_inputs
    assert DistillationLossFn().params == TopkKLParams()
    assert DistillationLossFn().implementation == "auto"
    with pytest.raises(TypeError, match="from_config"):
        DistillationLossFn(params=cfg)
    with pytest.raises(TypeError):
        DistillationLossFn(cfg)  # a config section goes through from_config
    with pytest.raises(TypeError):
        DistillationLossFn(kl_type="forward")  # the options travel as one TopkKLParams
    with pytest.raises(AttributeError, match="has no attribute"):
        DistillationLossFn.from_config(SimpleNamespace(kl_type="jsd"))
    with pytest.raises(ValueError, match="implementation must be one of"):
        DistillationLossFn(implementation="cuda")


def test_temperature_reaches_the_divergence():
    logits, data = make_batch(seed=6)
    cold = DistillationLossFn(params=TopkKLParams(temperature=0.5))(logits, data, 10)[0]
    warm = DistillationLossFn(params=TopkKLParams(temperature=2.0))(logits, data, 10)[0]
    expected = topk_kl(
        logits, data["teacher_topk_logprobs"], data["teacher_topk_indices"], temperature=2.0
    )
    mask = build_loss_mask(data["token_mask"], data["sample_mask"])
    torch.testing.assert_close(warm, (expected * mask).sum() / 10)
    assert not torch.allclose(cold, warm)


def test_bad_shapes_are_reported():
    logits, data = make_batch()
    with pytest.raises(ValueError, match="logits must be"):
        DistillationLossFn()(logits[:, :-1], data, 10)
