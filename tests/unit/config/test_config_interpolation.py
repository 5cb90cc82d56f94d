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


SAME_AS_OMEGACONF = [
    {
        "a": {"x": 1, "y": [1, "${..x}"]},
        "b": "${a}",
        "c": "${a.y}",
        "d": "${a.y.1}",
        "e": "${a.y[0]}",
    },
    {"c": {"k": 5}, "a": "${c}", "b": "${a.k}"},  # through a key whose value interpolates
    {"s": "v", "esc": "\\${s}", "esc2": "\\\\${s}", "mix": "pre-${s}-\\${s}-post"},
    {
        "n": None,
        "r": "${n}",
        "t": "x${n}",
        "b": True,
        "rb": "${b}-${b}",
        "f": 0.5,
        "rf": "${f}${f}",
    },
    {"n": 8, "q": "${mul:${n},2}", "quoted": "'${n}'", "list": "[${n}, 2]", "m": "${max:1.5, 2}"},
    {"a": {"b": {"c": "${...top}", "d": "${.c}"}}, "top": 3, "spaced": "${ top }"},
    {"k": "y", "y": 4, "named": "${${k}}", "text": "a b ${y} c"},
    {"d": {"0": "zero"}, "r": "${d.0}", "sec": {"a": 1}, "t": "x${sec}", "l": [1], "u": "x${l}"},
]


@pytest.mark.parametrize("config", SAME_AS_OMEGACONF)
def test_values_are_those_omegaconf_gives(config):
    register_resolvers()
    expected = OmegaConf.to_container(OmegaConf.create(config), resolve=True)
    assert resolve_interpolations(config) == expected


def test_a_section_referred_to_is_copied():
    resolved = resolve_interpolations({"a": {"x": [1]}, "b": "${a}"})
    assert resolved["b"] == resolved["a"] and resolved["b"]["x"] is not resolved["a"]["x"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"a": "${b}", "b": "${a}"},
            "b: interpolations refer to one another in a cycle: a -> b -> a",
        ),
        (
            {"a": {"b": "${a}"}},
            "a.b: interpolations refer to one another in a cycle: a -> a.b -> a",
        ),
        ({"a": "${b}", "b": "???"}, "b: mandatory value '???' was never set"),
        ({"a": "${..b}"}, "a: cannot resolve interpolation '${..b}': '..b' goes above the top"),
        (
            {"k": 3, "a": "${${k}}"},
            "a: cannot resolve interpolation '${${k}}': The following interpolation is used to "
            "denote a config key",
        ),
    ],
)
def test_what_cannot_be_resolved(config, message):
    with pytest.raises(ConfigError) as info:
        resolve_interpolations(config)
    assert str(info.value).startswith(message)


def test_registration_is_idempotent_and_complete():
    register_resolvers()
    register_resolvers()
    assert all(OmegaConf.has_resolver(name) for name in ("mul", "add", "div", "max"))
    assert set(RESOLVERS) == {"mul", "add", "div", "max"}


@pytest.mark.parametrize(
    ("expression", "fragment"),
    [
        ("${nope.x}", "refers to 'nope.x', which is not in the config"),
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
