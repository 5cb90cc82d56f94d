"""`defaults:` inheritance: merge order, relative paths, lists, cycles, bad entries."""

import pytest

from nemo_opd.config import ConfigError, load_config
from nemo_opd.config.loader import deep_merge, load_with_defaults


def test_deep_merge_child_wins_and_recurses():
    base = {"a": {"x": 1, "y": {"p": 1, "q": 2}}, "lst": [1, 2, 3], "keep": True}
    child = {"a": {"y": {"q": 20}, "z": 3}, "lst": [9]}
    merged = deep_merge(base, child)
    assert merged == {"a": {"x": 1, "y": {"p": 1, "q": 20}, "z": 3}, "lst": [9], "keep": True}
    assert base["a"]["y"]["q"] == 2, "deep_merge must not mutate its inputs"


def test_multi_level_inheritance_with_relative_paths(write_yaml):
    write_yaml("base/root.yaml", {"a": 1, "b": {"x": 1, "y": 1}, "c": "root"})
    write_yaml("base/middle.yaml", "defaults: root.yaml\nb:\n  y: 2\nc: middle\n")
    leaf = write_yaml("runs/leaf.yaml", "defaults: ../base/middle.yaml\nb:\n  x: 3\n")
    assert load_with_defaults(leaf) == {"a": 1, "b": {"x": 3, "y": 2}, "c": "middle"}


def test_list_of_defaults_merges_in_order_then_self(write_yaml):
    write_yaml("one.yaml", {"a": 1, "b": 1, "c": 1})
    write_yaml("two.yaml", {"b": 2, "c": 2})
    top = write_yaml("top.yaml", "defaults: [one.yaml, two.yaml]\nc: 3\n")
    assert load_with_defaults(top) == {"a": 1, "b": 2, "c": 3}


def test_diamond_inheritance_is_not_a_cycle(write_yaml):
    write_yaml("root.yaml", {"v": 0})
    write_yaml("left.yaml", "defaults: root.yaml\nl: 1\n")
    write_yaml("right.yaml", "defaults: root.yaml\nr: 1\n")
    top = write_yaml("top.yaml", "defaults: [left.yaml, right.yaml]\n")
    assert load_with_defaults(top) == {"v": 0, "l": 1, "r": 1}


def test_cycle_is_reported_with_the_chain(write_yaml):
    start = write_yaml("a.yaml", "defaults: b.yaml\n")
    write_yaml("b.yaml", "defaults: c.yaml\n")
    write_yaml("c.yaml", "defaults: a.yaml\n")
    with pytest.raises(ConfigError, match=r"circular .*a\.yaml -> b\.yaml -> c\.yaml -> a\.yaml"):
        load_with_defaults(start)


def test_self_inclusion_is_a_cycle(write_yaml):
    path = write_yaml("self.yaml", "defaults: self.yaml\na: 1\n")
    with pytest.raises(ConfigError, match="circular"):
        load_with_defaults(path)


def test_missing_parent_names_the_including_file(write_yaml):
    path = write_yaml("child.yaml", "defaults: nowhere.yaml\n")
    with pytest.raises(
        ConfigError, match=r"child\.yaml: `defaults:` entry 'nowhere\.yaml' not found"
    ):
        load_with_defaults(path)


@pytest.mark.parametrize("entry", ["3", "[a.yaml, {x: 1}]", "''"])
def test_bad_defaults_entry(write_yaml, entry):
    path = write_yaml("bad.yaml", f"defaults: {entry}\n")
    with pytest.raises(ConfigError, match="`defaults:` must be a file name or a list"):
        load_with_defaults(path)


def test_child_overrides_reach_validation(write_yaml, minimal):
    write_yaml("base.yaml", minimal)
    child = write_yaml("child.yaml", "defaults: base.yaml\nloss_fn:\n  kl_type: forward\n")
    cfg = load_config(child)
    assert cfg.loss_fn.kl_type == "forward"
    assert cfg.policy.model_name == "tiny:student"


def test_interpolation_sees_the_merged_values(write_yaml, minimal):
    minimal["teacher"]["max_total_sequence_length"] = "${policy.max_total_sequence_length}"
    write_yaml("base.yaml", minimal)
    child = write_yaml(
        "child.yaml",
        "defaults: base.yaml\npolicy:\n  max_total_sequence_length: 96\n"
        "  generation:\n    vllm_cfg:\n      max_model_len: 96\n",
    )
    assert load_config(child).teacher.max_total_sequence_length == 96


@pytest.mark.parametrize("key", ["default", "defualts", "Defaults"])
def test_a_misspelled_defaults_key_gets_the_same_suggestion_as_an_override(
    write_yaml, minimal, key
):
    # It listed the schema's sections ("valid keys here: policy, teacher, ...") after a
    # "required key is missing" for each section the parent would have given.
    write_yaml("base.yaml", minimal)
    child = write_yaml("child.yaml", f"{key}: base.yaml\n")
    with pytest.raises(ConfigError) as error:
        load_config(child)
    assert str(error.value) == (
        f"{child}: {key}: unknown key; did you mean 'defaults'? (the file or files this config "
        "extends)"
    )
