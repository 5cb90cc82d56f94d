"""On/off-policy data: the checks of distillation.lmbda, data.response_key and objective.loss
sft, and the rule that picks each step's kind (nemo_opd.algorithms.data_mix)."""

import random

import pytest
from config_errors import error_of

from nemo_opd.algorithms.data_mix import is_on_policy_step, on_policy_share
from nemo_opd.config import validate_config


def config(minimal, **distillation):
    minimal["distillation"].update(distillation)
    minimal["data"]["response_key"] = "solution"
    return validate_config(minimal)


def test_lmbda_1_and_0_are_every_step_and_none(minimal):
    on = config(minimal, lmbda=1.0)
    assert on_policy_share(on) == 1.0 and all(is_on_policy_step(on, s) for s in range(1, 500))
    off = config(minimal, lmbda=0.0)
    assert not any(is_on_policy_step(off, s) for s in range(1, 500))


def test_the_default_is_on_policy_and_sft_off_policy(minimal):
    assert on_policy_share(validate_config(minimal)) == 1.0
    minimal["objective"] = {"loss": "sft"}
    minimal["teacher"] = None
    sft = config(minimal)
    assert on_policy_share(sft) == 0.0 and not is_on_policy_step(sft, 1)


@pytest.mark.parametrize("lmbda", [0.25, 0.5, 0.9])
def test_a_share_draws_once_per_step_from_seed_and_step(minimal, lmbda):
    cfg = config(minimal, lmbda=lmbda, seed=7)
    kinds = [is_on_policy_step(cfg, step) for step in range(1, 2001)]
    # The documented rule, written out: on-policy when the step's draw is below lmbda.
    assert kinds == [random.Random(f"7-lmbda-{s}").random() < lmbda for s in range(1, 2001)]
    assert abs(sum(kinds) / len(kinds) - lmbda) < 0.04
    assert kinds[10:] == [is_on_policy_step(cfg, s) for s in range(11, 2001)]  # any order


def test_off_policy_steps_need_the_responses_column(minimal):
    minimal["distillation"]["lmbda"] = 0.5
    assert "distillation.lmbda 0.5 trains on the dataset's responses, but data.response_key" in (
        error_of(minimal)
    )


def test_sft_needs_responses_no_teacher_and_no_on_policy_share(minimal):
    minimal["objective"] = {"loss": "sft"}
    message = error_of(minimal)
    assert (
        "objective.loss 'sft' trains on the dataset's responses, but data.response_key" in message
    )
    assert "teacher is configured but no objective term uses it" in message
    minimal["teacher"] = None
    minimal["data"]["response_key"] = "solution"
    minimal["distillation"]["lmbda"] = 0.5
    assert "leave it null or set it to 0" in error_of(minimal)
    minimal["distillation"]["lmbda"] = 0.0
    validate_config(minimal)
    minimal["objective"]["opd_coef"] = 0.5
    assert "only apply to objective.loss 'policy_gradient', but it is 'sft'" in error_of(minimal)


def test_policy_gradient_learns_on_policy_only(minimal):
    minimal["objective"] = {"loss": "policy_gradient", "opd_coef": 1.0}
    minimal["data"]["response_key"] = "solution"
    minimal["distillation"]["lmbda"] = 0.9
    assert "objective.loss 'policy_gradient' learns from the student's own samples" in (
        error_of(minimal)
    )


@pytest.mark.parametrize("lmbda", [-0.1, 1.5])
def test_lmbda_is_a_share(minimal, lmbda):
    minimal["distillation"]["lmbda"] = lmbda
    assert "distillation.lmbda" in error_of(minimal)


@pytest.mark.parametrize(
    ("template", "response_key", "problem"),
    [
        ("{prompt} Solution: {response}", "solution", None),
        ("{prompt} (answer: {answer})", None, None),
        ("{prompt} {solution}", "solution", "names {solution}, which the records lack"),
        ("{prompt} {response}", None, "names {response}, but data.response_key is null"),
        ("{prompt} {}", None, "names {}, which the records lack"),
        ("{prompt", None, "is not a valid format string"),
    ],
)
def test_a_privileged_template_names_record_fields(minimal, template, response_key, problem):
    minimal["teacher"]["prompt_template"] = template
    minimal["data"]["response_key"] = response_key
    if problem is None:
        validate_config(minimal)
    else:
        assert problem in error_of(minimal)


def test_seq_kd_needs_off_policy_steps_and_a_teacher_that_samples(minimal):
    minimal["distillation"]["seq_kd"] = True
    assert "every step is on-policy (distillation.lmbda is 1 or null)" in error_of(minimal)
    minimal["distillation"]["lmbda"] = 0.5
    validate_config(minimal)  # the teacher samples: no data.response_key needed
    minimal["teacher"]["server"] = {"enabled": True}
    assert "cannot sample from a served teacher yet" in error_of(minimal)
    minimal["teacher"]["server"] = {"enabled": False}
    minimal["objective"] = {"loss": "sft"}
    minimal["distillation"]["lmbda"] = 0.0
    assert "distillation.seq_kd with objective.loss 'sft' is not supported yet" in error_of(minimal)
