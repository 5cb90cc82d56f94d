"""Loading a config is bounded in time and memory whatever the input, and every bad input ends
in one ConfigError (exit status 2 from the command line), never a hang or a traceback.

Each input here hung, ate memory or ended in a traceback before the bounds existed; the timeout
marks turn a regression into a failure instead of a stuck test run.
"""

import os
import time
from pathlib import Path

import pytest

from nemo_opd import cli
from nemo_opd.config import ConfigError, compose_config, load_config
from nemo_opd.config.bounds import (
    MAX_DEFAULTS_LOADS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_INTERPOLATED_CHARS,
    MAX_OVERRIDE_CHARS,
    MAX_PARSED_CHARS,
    MAX_REFERENCE_CHAIN,
    MAX_RESOLUTIONS,
    MAX_VALUES,
)

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"

pytestmark = pytest.mark.timeout(60)


def on_tiny(write_yaml, name: str, body: str) -> Path:
    """A config file that inherits the tiny example and adds `body`."""
    return write_yaml(name, f"defaults: {TINY}\n{body}")


def alias_bomb(levels: int = 9) -> str:
    """YAML in which each anchor is a list of ten uses of the previous one: 10**levels values
    once expanded, a few hundred bytes on disk."""
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    for i in range(1, levels):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def refused(path: Path, *overrides: str) -> str:
    with pytest.raises(ConfigError) as error:
        load_config(path, overrides)
    return str(error.value)


def test_alias_bomb_in_a_file(write_yaml):
    message = refused(on_tiny(write_yaml, "bomb.yaml", alias_bomb()))
    assert f"more than {MAX_VALUES:,} values once YAML aliases are expanded" in message
    assert message.startswith(str(Path(write_yaml("x", "")).parent / "bomb.yaml"))


def test_an_override_cannot_expand():
    # Hydra's grammar has no YAML aliases: a YAML alias bomb is text it cannot read
    inner = "&a [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"
    levels = [inner] + [
        f"&{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 10) + "]" for i in range(8)
    ]
    message = refused(TINY, f"+bomb=[{', '.join(levels)}]")
    assert message.startswith("override '+bomb=") and "cannot read the value" in message
    # and an override's length is bounded before it is parsed
    message = refused(TINY, "+big=[" + "1," * MAX_OVERRIDE_CHARS + "1]")
    assert f"more than the {MAX_OVERRIDE_CHARS:,} an override may have" in message


def test_a_self_referencing_alias_is_refused(write_yaml):
    # An infinitely deep list: the walk stops at the depth bound.
    message = refused(on_tiny(write_yaml, "loop.yaml", "loop: &x [1, *x]\n"))
    assert message.endswith(f"loop.yaml: values nested more than {MAX_DEPTH} levels deep")


def test_diamond_of_defaults_loads_each_file_once(write_yaml):
    # d0 lists d1 twice, d1 lists d2 twice, ...: 2**30 loads without sharing the results.
    depth = 30
    for i in range(depth):
        parents = f"[d{i + 1}.yaml, d{i + 1}.yaml]" if i + 1 < depth else f"{TINY}"
        write_yaml(f"d{i}.yaml", f"defaults: {parents}\n")
    path = Path(write_yaml("x", "")).parent / "d0.yaml"
    assert (
        load_config(path).distillation.max_num_steps == load_config(TINY).distillation.max_num_steps
    )


def test_too_many_defaults_loads(write_yaml):
    write_yaml("base.yaml", f"defaults: {TINY}\n")
    path = write_yaml("many.yaml", "defaults: [" + ", ".join(["base.yaml"] * 300) + "]\n")
    assert f"loaded more than {MAX_DEFAULTS_LOADS} files" in refused(path)


@pytest.mark.parametrize("special", ["/dev/zero", "fifo"])
def test_config_must_be_a_regular_file(tmp_path, special):
    path = Path(special)
    if special == "fifo":
        path = tmp_path / "config.yaml"
        os.mkfifo(path)  # opening it for reading would block forever
    assert refused(path) == f"config path is not a regular file (a device, FIFO or socket): {path}"


def test_config_file_size_is_capped(write_yaml):
    path = write_yaml("huge.yaml", "# " + "x" * MAX_FILE_BYTES + "\n")
    assert f"more than the {MAX_FILE_BYTES:,} a config may have" in refused(path)


def test_integer_of_thousands_of_digits(write_yaml):
    path = on_tiny(write_yaml, "digits.yaml", "distillation:\n  seed: " + "9" * 5000 + "\n")
    message = refused(path)
    assert message.startswith(f"{path}: invalid value: Exceeds the limit")
    assert "set_int_max_str_digits" not in message
    assert "invalid value: Exceeds the limit" in refused(TINY, "distillation.seed=" + "9" * 5000)


def test_deep_nesting(write_yaml):
    for depth in (MAX_DEPTH + 5, 5000):  # past our bound; past Python's recursion limit
        path = write_yaml(f"deep{depth}.yaml", "x: " + "[" * depth + "]" * depth + "\n")
        assert f"nested more than {MAX_DEPTH} levels deep" in refused(path)
    message = refused(TINY, "+x=" + "[" * 5000 + "]" * 5000)
    assert message.startswith("override '+x=") and "nested more than" in message


@pytest.mark.parametrize(
    ("body", "excess"),
    [
        # text that doubles at every key
        (
            "x0: abcdefgh\n" + "".join(f"x{i}: ${{x{i - 1}}}${{x{i - 1}}}\n" for i in range(1, 60)),
            f"{MAX_INTERPOLATED_CHARS:,} characters",
        ),
        # a section that doubles at every key
        (
            "y0: [1, 2, 3]\n"
            + "".join(f"y{i}: ['${{y{i - 1}}}', '${{y{i - 1}}}']\n" for i in range(1, 60)),
            f"{MAX_VALUES:,} values",
        ),
    ],
)
def test_interpolation_that_doubles(write_yaml, body, excess):
    # OmegaConf resolved a key again each time another referred to it (2**59 resolutions
    # here); each key is resolved once, and what the references yield is bounded
    message = refused(on_tiny(write_yaml, "double.yaml", body))
    assert f"interpolations would produce more than {excess}" in message


def test_an_interpolation_that_resolves_to_too_much_text(write_yaml):
    body = "big: " + "a" * 600_000 + "\ntwice: ${big}${big}\n"
    message = refused(on_tiny(write_yaml, "big.yaml", body))
    produce = f"interpolations would produce more than {MAX_INTERPOLATED_CHARS:,} characters"
    assert message.startswith(f"twice: the config's {produce}")
    # a reference to a long text yields it again, whether or not it is joined to other text
    body = "big: " + "a" * 600_000 + "\nonce: ${big}\nagain: ${big}\n"
    message = refused(on_tiny(write_yaml, "big.yaml", body))
    assert message.startswith(f"again: the config's {produce}")


def test_what_is_parsed_is_bounded(write_yaml):
    # OmegaConf's parser takes about a second for 5,000 interpolations or 400 KB of text
    body = "empty: ''\nmany: " + "${empty}" * (MAX_RESOLUTIONS + 1) + "\n"
    message = refused(on_tiny(write_yaml, "many.yaml", body))
    assert message.startswith(
        f"many: the config's values with interpolations hold more than {MAX_RESOLUTIONS:,} `${{`"
    )
    body = "empty: ''\nlong: ${empty}" + "a" * MAX_PARSED_CHARS + "\n"
    message = refused(on_tiny(write_yaml, "long.yaml", body))
    assert message.startswith(
        f"long: the config's values with interpolations come to more than {MAX_PARSED_CHARS:,}"
    )


def test_a_long_chain_of_references(write_yaml):
    # each key refers to the next one down, so none is resolved before the chain reaches k0
    def chain(length: int) -> str:
        return "".join(f"k{i}: ${{k{i - 1}}}\n" for i in range(length, 0, -1)) + "k0: 1\n"

    message = refused(on_tiny(write_yaml, "chain.yaml", chain(200)))
    assert message.startswith(f"k{200 - MAX_REFERENCE_CHAIN}: a chain of more than")
    composed = compose_config(on_tiny(write_yaml, "chain.yaml", chain(MAX_REFERENCE_CHAIN)))
    assert composed[f"k{MAX_REFERENCE_CHAIN}"] == 1


@pytest.mark.parametrize(
    "resolver", ["oc.select", "oc.env", "oc.decode", "oc.create", "oc.dict.keys"]
)
def test_omegaconfs_own_resolvers_are_refused(write_yaml, resolver):
    """oc.select re-evaluates at every level of a chain (16 levels of doubling ran past a
    minute); oc.env would copy a secret into the printed and logged config."""
    levels = "".join(
        f"  x{i}: '${{{resolver}:b.x{i - 1}}}${{{resolver}:b.x{i - 1}}}'\n" for i in range(1, 17)
    )
    start = time.monotonic()
    message = refused(on_tiny(write_yaml, "select.yaml", f"b:\n  x0: a\n{levels}"))
    assert time.monotonic() - start < 5
    assert f"the resolver {resolver!r} is not available" in message
    assert "an environment variable never enters a config" in message


SECRET = "hunter2-env-value"


def wandb_name(project: str, name: str) -> str:
    """YAML that sets logger.wandb.project and .name (two keys the schema takes as any text)."""
    return f"logger:\n  wandb:\n    project: {project}\n    name: {name}\n"


@pytest.mark.parametrize(
    "body",
    [
        # the resolver's name read from a key, whole or in part
        pytest.param(wandb_name("oc.env", "'${${.project}:NEMO_OPD_TEST_SECRET}'"), id="name"),
        pytest.param(wandb_name("env", "'${oc.${.project}:NEMO_OPD_TEST_SECRET}'"), id="part"),
        # an escaped backslash, then the interpolation
        pytest.param(wandb_name("p", "'\\\\${oc.env:NEMO_OPD_TEST_SECRET}'"), id="backslash"),
        pytest.param(wandb_name("p", "'x\\\\${oc.env:NEMO_OPD_TEST_SECRET}'"), id="in-text"),
    ],
)
def test_an_environment_variable_never_enters_a_config(write_yaml, monkeypatch, body):
    monkeypatch.setenv("NEMO_OPD_TEST_SECRET", SECRET)
    message = refused(on_tiny(write_yaml, "env.yaml", body))
    assert "the resolver 'oc.env' is not available" in message
    assert "an environment variable never enters a config" in message
    assert SECRET not in message


def resolver_alias_bomb(levels: int) -> str:
    """A flow mapping of YAML anchors, each ten uses of the previous one: oc.create would parse
    it to 10**levels values."""
    anchors = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    anchors += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "{" + ", ".join(anchors) + "}"


def test_an_alias_bomb_cannot_reach_oc_create(write_yaml):
    # each level took 10x the last (7 levels: minutes) before resolvers were looked up by
    # the name they resolve to
    body = wandb_name("oc.create", f"\"${{${{.project}}:'{resolver_alias_bomb(7)}'}}\"")
    start = time.monotonic()
    message = refused(on_tiny(write_yaml, "bomb.yaml", body))
    assert time.monotonic() - start < 5
    assert "the resolver 'oc.create' is not available" in message


def test_keys_named_by_interpolations_are_bounded_too(write_yaml):
    # x<i> refers twice to the key n<i> names, x<i-1>: each level doubled the work (16 levels
    # took a minute) where the size of the text was estimated from its shape
    levels = "".join(f"n{i}: x{i - 1}\nx{i}: ${{${{n{i}}}}}${{${{n{i}}}}}\n" for i in range(1, 40))
    start = time.monotonic()
    message = refused(on_tiny(write_yaml, "double.yaml", "x0: abcdefgh\n" + levels))
    assert time.monotonic() - start < 5
    assert f"more than {MAX_INTERPOLATED_CHARS:,} characters" in message


def test_resolver_results_are_bounded(write_yaml):
    product = "${mul:" + ",".join(["99999999999"] * 500) + "}"
    message = refused(TINY, f"distillation.seed='{product}'")
    assert "'mul' gives an integer of more than 64 bits" in message
    nested = "1"
    for _ in range(200):
        nested = "${add:" + nested + ",1}"
    assert "nested 200 deep, more than the" in refused(TINY, f"distillation.seed='{nested}'")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("policy.optimizer.lr=inf", "policy.optimizer.lr"),
        ("loss_fn.temperature=nan", "loss_fn.temperature"),
        ("env.math.timeout_s=1e400", "env.math.timeout_s"),
        ("policy.generation.temperature=-inf", "policy.generation.temperature"),
    ],
)
def test_non_finite_numbers_are_refused(override, key):
    assert f"{key}: must be a finite number" in refused(TINY, override)


def test_sizes_have_upper_bounds():
    message = refused(TINY, "policy.max_total_sequence_length=1000000000000")
    assert "policy.max_total_sequence_length: must be less than or equal to 1048576" in message
    assert "distillation.num_prompts_per_step: must be less than or equal to" in refused(
        TINY, "distillation.num_prompts_per_step=10000000000"
    )


def test_the_command_line_reports_each_without_a_traceback(write_yaml, tmp_path, capsys):
    bomb = on_tiny(write_yaml, "bomb.yaml", alias_bomb())
    cases = [
        ["--config", str(bomb)],
        ["--config", "/dev/zero"],
        ["--config", str(TINY), "distillation.seed=" + "9" * 5000],
        ["--config", str(TINY), "+x=" + "[" * 5000 + "]" * 5000],
        ["--config", str(TINY), "policy.optimizer.lr=inf"],
    ]
    for argv in cases:
        assert cli.main([*argv, "--print-config"]) == cli.EXIT_CONFIG_ERROR, argv
        out, err = capsys.readouterr()
        assert out == "" and err.startswith("error: ") and "Traceback" not in err
