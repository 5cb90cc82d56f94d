"""`${...}` interpolation (absolute and relative), the arithmetic resolvers, and their errors."""

import pytest
from omegaconf import OmegaConf

from nemo_opd.config import ConfigError, load_config
from nemo_opd.config.interpolation import (
    RESOLVERS,
    interpolated_keys,
    register_resolvers,
    resolve_interpolations,
)


def test_absolute_and_relative_interpolation():
    config = {
        "policy": {
            "model_name": "m",
            "n": 8,
            "tokenizer": {"name": "${..model_name}"},
            "gen": {"vllm": {"len": "${...n}"}, "same": "${.vllm.len}"},
        },
        "teacher": {"n": "${policy.n}"},
    }
    resolved = resolve_interpolations(config)
    assert resolved["policy"]["tokenizer"]["name"] == "m"
    assert resolved["policy"]["gen"] == {"vllm": {"len": 8}, "same": 8}
    assert resolved["teacher"]["n"] == 8


def test_string_interpolation_inside_text():
    assert resolve_interpolations({"a": "x", "b": "run-${a}-1"})["b"] == "run-x-1"


@pytest.mark.parametrize(
    ("expression", "expected"),
    [
        ("${mul:${n},2}", 16),
        ("${mul:2,3,4}", 24),
        ("${mul:${n},0.5}", 4.0),
        ("${add:${n},1}", 9),
        ("${add:1,2.5,3}", 6.5),
        ("${div:${n},4}", 2),
        ("${div:${n},3}", 8 / 3),
        ("${div:9.0,3}", 3.0),
        ("${max:1,${n},3}", 8),
        ("${max:1.5,1}", 1.5),
        ("${mul:${add:${n},2},${max:1,3}}", 30),
    ],
)
def test_resolvers(expression, expected):
    value = resolve_interpolations({"n": 8, "v": expression})["v"]
    assert value == expected
    assert type(value) is type(expected)


def test_registration_is_idempotent_and_complete():
    register_resolvers()
    register_resolvers()
    assert all(OmegaConf.has_resolver(name) for name in ("mul", "add", "div", "max"))
    assert set(RESOLVERS) == {"mul", "add", "div", "max"}


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("${nope.x}", "Interpolation key 'nope.x' not found"),
        ("${mull:1,2}", "the resolver 'mull' is not available; did you mean 'mul'?"),
        ("${mul:x,2}", "'mul' takes numbers, got 'x'"),
        ("${mul:true,2}", "'mul' takes numbers, got true"),
        ("${div:1,0}", "'div' by zero"),
        ("${div:1,2,3}", "'div' takes 2 arguments, got 3"),
        ("${add:1", "cannot resolve interpolation"),
    ],
)
def test_resolution_errors_name_the_key_and_expression(expression, fragment):
    with pytest.raises(ConfigError) as info:
        resolve_interpolations({"section": {"key": expression}})
    message = str(info.value)
    assert message.startswith("section.key: cannot resolve interpolation")
    assert repr(expression) in message
    assert fragment in message


def test_mandatory_value_never_set():
    with pytest.raises(ConfigError, match=r"^a\.b: mandatory value '\?\?\?' was never set"):
        resolve_interpolations({"a": {"b": "???"}})


def test_interpolated_keys_records_raw_expressions():
    config = {"a": {"b": "${c}", "d": 1, "l": [1, "${c}"]}, "c": 2}
    assert interpolated_keys(config) == {"a.b": "${c}", "a.l[1]": "${c}"}


def test_validation_error_says_which_interpolation_produced_the_value(write_yaml, minimal):
    minimal["policy"]["logprob_batch_size"] = "${.train_micro_batch_size}"
    minimal["policy"]["train_micro_batch_size"] = 0
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml("c.yaml", minimal))
    assert (
        "policy.logprob_batch_size: must be greater than 0; got 0 "
        "(from ${.train_micro_batch_size})" in str(info.value)
    )


def test_overrides_are_applied_before_interpolation(write_yaml, minimal):
    minimal["teacher"]["max_total_sequence_length"] = "${policy.max_total_sequence_length}"
    path = write_yaml("c.yaml", minimal)
    cfg = load_config(path, ["policy.max_total_sequence_length=100"])
    assert cfg.teacher.max_total_sequence_length == 100
