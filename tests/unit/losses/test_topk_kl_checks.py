"""Input checks: clear ValueErrors for malformed inputs."""

import math

import pytest
import torch
from topk_kl_testing import make_case

from nemo_opd.losses import (
    DistillationLossFn,
    TopkKLParams,
    topk_kl,
    topk_kl_with_stats,
    validate_teacher_topk,
)


@pytest.fixture
def case():
    return make_case(4, 50, 5, seed=0)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda z, a, i: (z.long(), a, i), "student_logits must be a float"),
        (lambda z, a, i: (z, a.long(), i), "teacher_logprobs must be a float"),
        (lambda z, a, i: (z, a, i.float()), "teacher_indices must be an integer"),
        (lambda z, a, i: (z, a[:, :4], i), "must have the same shape"),
        (lambda z, a, i: (z[:3], a, i), "leading dims differ"),
        (lambda z, a, i: (z[:, :4], a, i), "exceed the vocabulary size"),
        (lambda z, a, i: (z, a[:, :0], i[:, :0]), "k >= 1"),
    ],
)
def test_shape_and_dtype_errors(case, mutate, message):
    z, a, i = mutate(*case)
    with pytest.raises(ValueError, match=message):
        topk_kl(z, a, i)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(kl_type="kl"), "kl_type must be one of"),
        (dict(tail="drop"), "tail must be one of"),
        (dict(temperature=0.0), "temperature must be a positive"),
        (dict(temperature=math.nan), "temperature must be a positive"),
        (dict(jsd_beta=1.5), "jsd_beta must be in"),
        (dict(mixed_kl_weight=-0.1), "mixed_kl_weight must be in"),
        (dict(implementation="cuda"), "implementation must be one of"),
        (dict(vocab_start=3), "needs a tp_group"),
    ],
)
def test_option_errors(case, options, message):
    with pytest.raises(ValueError, match=message):
        topk_kl(*case, **options)


def test_params_defaults_are_valid():
    assert TopkKLParams() == TopkKLParams("reverse", 0.5, 0.5, "bucket", 1.0)


def test_options_as_keywords_or_as_params_but_not_both(case):
    options = dict(kl_type="jsd", jsd_beta=0.3, tail="renormalize", temperature=0.7)
    by_keywords = topk_kl(*case, **options)
    by_params = topk_kl(*case, params=TopkKLParams(**options))
    torch.testing.assert_close(by_params, by_keywords, atol=0, rtol=0)
    assert not torch.allclose(by_params, topk_kl(*case))
    with pytest.raises(TypeError, match=r"not both \(got params and \['temperature'\]\)"):
        topk_kl(*case, params=TopkKLParams(), temperature=2.0)
    with pytest.raises(TypeError, match="params must be a TopkKLParams"):
        topk_kl_with_stats(*case, params=options)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda a, i: (a, i.index_fill(1, torch.tensor([2]), 50)), r"outside \[0, 50\)"),
        (lambda a, i: (a, i.index_fill(1, torch.tensor([0]), -2)), r"outside \[0, 50\)"),
        # -1 is an empty slot, which must carry a log-prob of -inf
        (lambda a, i: (a, i.index_fill(1, torch.tensor([0]), -1)), r"empty slot"),
        (lambda a, i: (a, torch.cat([i[:, :1], i[:, :4]], 1)), "duplicate"),
        (lambda a, i: (a.index_fill(1, torch.tensor([1]), math.nan), i), r"NaN or \+inf"),
        (lambda a, i: (a.index_fill(1, torch.tensor([1]), math.inf), i), r"NaN or \+inf"),
        (lambda a, i: (a - a.logsumexp(-1, keepdim=True) + 0.01, i), "summing above 1"),
    ],
)
def test_teacher_value_errors(case, mutate, message):
    _, a, i = case
    validate_teacher_topk(a, i, 50)  # the well-formed case passes
    bad_a, bad_i = mutate(a, i)
    with pytest.raises(ValueError, match=message):
        validate_teacher_topk(bad_a, bad_i, 50)
    with pytest.raises(ValueError, match=message):
        topk_kl(case[0], bad_a, bad_i, validate=True)


def test_teacher_may_rule_out_ids_with_minus_inf(case):
    _, a, i = case
    validate_teacher_topk(a.index_fill(1, torch.tensor([1, 3]), -math.inf), i, 50)


def test_teacher_errors_name_the_first_position_and_respect_the_mask():
    a = torch.log_softmax(torch.randn(2, 3, 10), -1).topk(4).values
    i = torch.arange(4).expand(2, 3, 4).clone()
    i[1, 2, 3] = 99
    with pytest.raises(ValueError, match=r"1 position\(s\), first at \(1, 2\)"):
        validate_teacher_topk(a, i, 10)
    mask = torch.ones(2, 3)
    mask[1, 2] = 0
    validate_teacher_topk(a, i, 10, mask=mask)  # the bad position is masked out


def test_mass_tolerance_is_configurable(case):
    _, a, i = case
    a = a - torch.logsumexp(a, -1, keepdim=True) + math.log1p(5e-4)  # mass 1.0005
    validate_teacher_topk(a, i, 50)
    with pytest.raises(ValueError, match="summing above 1"):
        validate_teacher_topk(a, i, 50, mass_tolerance=1e-4)


def test_loss_fn_validates_only_when_asked_and_only_valid_positions(case):
    z, a, i = case
    bad = i.clone()
    bad[3, 0] = bad[3, 1]  # duplicate at position (1, 1) of the [2, 2] batch
    data = {
        "teacher_topk_logprobs": a.view(2, 2, 5),
        "teacher_topk_indices": bad.view(2, 2, 5),
        "token_mask": torch.ones(2, 2),
    }
    # Position (1, 1) is the last of its row: never graded, so never checked.
    DistillationLossFn(validate_inputs=True)(z.view(2, 2, 50), data, 2)
    data["loss_mask"] = torch.ones(2, 2)
    with pytest.raises(ValueError, match="duplicate"):
        DistillationLossFn(validate_inputs=True)(z.view(2, 2, 50), data, 4)
    DistillationLossFn()(z.view(2, 2, 50), data, 4)  # unchecked by default: no host sync


def test_empty_slots_pass_validation(case):
    _, a, i = case
    a, i = a.clone(), i.clone()
    a[:, 3:], i[:, 3:] = -math.inf, -1  # two empty slots per position: not duplicates
    validate_teacher_topk(a, i, 50)
