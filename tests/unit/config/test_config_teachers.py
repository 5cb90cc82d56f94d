"""Several teachers routed by a record field: `teachers`, data.teacher_key and
data.teacher_routes, their checks, and overrides that name a teacher."""

import pytest
from config_errors import error_of

from nemo_opd.config import ConfigError, apply_overrides, validate_config


def routed(minimal, routes=None, **teachers):
    """`minimal` with its teacher moved under teachers.<name> for each name given."""
    teacher = minimal.pop("teacher")
    minimal["teachers"] = {name: dict(teacher, **extra) for name, extra in teachers.items()}
    minimal["data"]["teacher_key"] = "operation"
    minimal["data"]["teacher_routes"] = routes
    return minimal


def test_named_teachers_are_every_teacher_by_name(minimal):
    assert list(validate_config(minimal).named_teachers) == ["teacher"]
    cfg = validate_config(routed(minimal, math={}, words={"model_name": "tiny:student"}))
    assert cfg.teacher is None
    assert {n: t.model_name for n, t in cfg.named_teachers.items()} == {
        "math": "tiny:teacher",
        "words": "tiny:student",
    }
    minimal.pop("teachers")
    minimal["data"] = {"dataset_name": "tiny_math"}
    minimal["objective"] = {"loss": "policy_gradient", "reward_estimator": "grpo"}
    assert validate_config(minimal).named_teachers == {}


def test_each_teacher_section_is_checked_under_its_own_key(minimal):
    data = routed(minimal, math={}, words={"max_total_sequence_length": 32, "scheduler": {}})
    message = error_of(data)
    assert "teachers.words.max_total_sequence_length (32) must be at least" in message
    assert "teachers.words.scheduler must be null" in message
    assert "teachers.math" not in message


def test_an_unknown_key_inside_a_teacher_is_named_with_its_path(minimal):
    message = error_of(routed(minimal, math={"model_nam": "x"}))
    assert "teachers.math.model_nam" in message and "model_name" in message


def test_overrides_reach_into_a_named_teacher(minimal):
    data = routed(minimal, math={})
    changed = apply_overrides(
        data,
        [
            "teachers.math.precision=bfloat16",
            "teachers.words.model_name=tiny:student",
            "data.teacher_routes.addition=math",
        ],
    )
    assert changed["teachers"]["math"]["precision"] == "bfloat16"
    assert changed["teachers"]["words"] == {"model_name": "tiny:student"}
    assert changed["data"]["teacher_routes"] == {"addition": "math"}
    with pytest.raises(ConfigError, match="unknown key teachers.math.model_nam"):
        apply_overrides(data, ["teachers.math.model_nam=x"])


def test_a_route_naming_an_unknown_teacher_is_refused(minimal):
    data = routed(minimal, {"addition": "math", "multiplication": "maths"}, math={})
    message = error_of(data)
    assert "data.teacher_routes.multiplication routes to 'maths', which is not a teacher" in message
    assert "['math']" in message


def test_teachers_need_a_key_and_replace_teacher(minimal):
    data = routed(minimal, math={})
    data["data"]["teacher_key"] = None
    data["teacher"] = dict(data["teachers"]["math"])
    message = error_of(data)
    assert "teacher and teachers are both set" in message
    assert "teachers (several teachers) needs data.teacher_key" in message


def test_routing_keys_without_teachers_are_refused(minimal):
    minimal["data"]["teacher_key"] = "operation"
    assert "data.teacher_key routes prompts to several teachers, but teachers is null" in (
        error_of(minimal)
    )


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ({"server": {"enabled": True}}, "teachers.math.server.enabled: a served teacher"),
        ({"prompt_template": "{prompt}"}, "teachers.math.prompt_template: privileged context"),
    ],
)
def test_what_routed_teachers_do_not_support_yet_is_refused(minimal, extra, expected):
    assert expected in error_of(routed(minimal, math=extra))


def test_names_become_metric_names_so_they_are_plain(minimal):
    assert "the names ['a b'] are not" in error_of(routed(dict(minimal), **{"a b": {}}))
    assert "teachers is empty" in error_of(routed(minimal))


def test_seq_kd_needs_a_single_teacher(minimal):
    data = routed(minimal, math={})
    data["distillation"].update(lmbda=0.5, seq_kd=True)
    assert "distillation.seq_kd with several teachers is not supported yet" in error_of(data)


def test_an_unused_routed_teacher_is_refused(minimal):
    data = routed(minimal, math={})
    data["objective"] = {"loss": "policy_gradient", "reward_estimator": "grpo"}
    assert "teachers is configured but no objective term uses it" in error_of(data)


def test_chat_template_kwargs_are_scalars(minimal):
    minimal["policy"]["tokenizer"]["chat_template_kwargs"] = {"enable_thinking": False}
    cfg = validate_config(minimal)
    assert cfg.policy.tokenizer.chat_template_kwargs == {"enable_thinking": False}
    minimal["policy"]["tokenizer"]["chat_template_kwargs"] = {"tools": [{"name": "x"}]}
    with pytest.raises(ConfigError, match="chat_template_kwargs"):
        validate_config(minimal)


def test_the_unrendered_share_of_a_teacher_is_a_share(minimal):
    """teacher.max_unrendered_share (a teacher with another tokenizer: how many of a step's
    conversations its template may fail to render before the run stops) is from 0 to 1."""
    assert validate_config(minimal).teacher.max_unrendered_share == 0.1
    minimal["teacher"]["max_unrendered_share"] = 1.5
    assert "teacher.max_unrendered_share" in error_of(minimal)
    cfg = validate_config(routed(minimal, math={"max_unrendered_share": 0.0}))
    assert cfg.teachers["math"].max_unrendered_share == 0.0
