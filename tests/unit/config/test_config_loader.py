"""load_config end to end: file errors, YAML errors with file:line, and the YAML round trip."""

import pytest

from nemo_opd.config import (
    ConfigError,
    DistillationConfig,
    compose_config,
    load_config,
    to_dict,
    to_yaml,
)


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=f"^config file not found: {missing}$"):
        load_config(missing)


def test_directory_instead_of_file(tmp_path):
    with pytest.raises(ConfigError, match="is a directory"):
        load_config(tmp_path)


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("policy:\n  model_name: [a, b\n", ":3:1:", "expected ',' or ']'"),
        ("policy:\n  a: 1\n b: 2\n", ":3:2:", "expected <block end>"),
        ("a: b: c\n", ":1:5:", "mapping values are not allowed here"),
        ("policy:\n  lr: 1\n  lr: 2\n", ":3:3:", "duplicate key 'lr' (first defined on line 2)"),
        ("a: 1\n\tb: 2\n", ":2:1:", "found character '\\t'"),
    ],
)
def test_malformed_yaml_reports_file_line_and_column(write_yaml, text, where, problem):
    path = write_yaml("broken.yaml", text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}{where} invalid YAML: ")
    assert problem in message


def test_malformed_parent_is_reported_with_its_own_name(write_yaml):
    parent = write_yaml("parent.yaml", "a: [1\n")
    child = write_yaml("child.yaml", "defaults: parent.yaml\n")
    with pytest.raises(ConfigError, match=f"^{parent}:2:1: invalid YAML"):
        load_config(child)


@pytest.mark.parametrize("text", ["- a\n- b\n", "just a string\n", "3\n"])
def test_top_level_must_be_a_mapping(write_yaml, text):
    with pytest.raises(ConfigError, match="a config file must be a mapping of keys"):
        load_config(write_yaml("list.yaml", text))


def test_empty_file_reports_the_missing_sections(write_yaml):
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml("empty.yaml", ""))
    message = str(info.value)
    for section in ("policy", "distillation", "data"):
        assert f"  {section}: required key is missing" in message
    assert "teacher" not in message  # optional: reward-only objectives have none


def test_yaml_1_2_floats_and_dates_as_strings(write_yaml, minimal):
    path = write_yaml("c.yaml", minimal)
    text = path.read_text().replace("lr: 0.001", "lr: 1e-3")
    assert "lr: 1e-3" in text
    path.write_text(text + "logger:\n  wandb:\n    name: 2024-01-01\n")
    cfg = load_config(path)
    assert cfg.policy.optimizer.lr == 1e-3
    assert cfg.logger.wandb.name == "2024-01-01"


def test_compose_config_returns_the_resolved_unvalidated_dict(write_yaml, minimal):
    minimal["teacher"]["max_total_sequence_length"] = "${policy.max_total_sequence_length}"
    minimal["unknown_section"] = {"x": "${policy.model_name}"}
    composed = compose_config(write_yaml("c.yaml", minimal), ["policy.model_name=other"])
    assert composed["teacher"]["max_total_sequence_length"] == 64
    assert composed["unknown_section"] == {"x": "other"}


def test_to_yaml_round_trips(write_yaml, minimal, tmp_path):
    cfg = load_config(write_yaml("c.yaml", minimal), ["policy.optimizer.betas=[0.8, 0.95]"])
    printed = tmp_path / "printed.yaml"
    printed.write_text(to_yaml(cfg))
    again = load_config(printed)
    assert again == cfg
    assert to_dict(again)["policy"]["optimizer"]["betas"] == [0.8, 0.95]


def test_to_yaml_of_one_section(write_yaml, minimal):
    cfg = load_config(write_yaml("c.yaml", minimal))
    assert to_yaml(cfg.loss_fn).splitlines()[0] == "kl_type: reverse"
    assert isinstance(cfg, DistillationConfig)
