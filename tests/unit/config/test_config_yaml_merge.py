"""YAML anchors and merge keys (`<<: *anchor`), as NeMo-RL's configs are written: they load in a
config and in every file it inherits, with YAML's precedence, each use a copy of its own, and
a merge-key bomb refused at once (the expansion itself is bounded, not only its result).

Before merge keys were read, every `<<:` ended in "could not determine a constructor for the
tag 'tag:yaml.org,2002:merge'".
"""

import time
from pathlib import Path

import pytest
import yaml
from test_config_hostile import assert_refused, run_cli

from nemo_opd.config import ConfigError, compose_config, load_config
from nemo_opd.config.bounds import MAX_DEPTH, MAX_VALUES
from nemo_opd.config.loader import parse_yaml

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"

pytestmark = pytest.mark.timeout(60)

# The student's and teacher's shared section, written once and merged, as NeMo-RL writes it.
MERGED = f"""\
defaults: {TINY}
policy: &POLICY
  model_name: tiny:student
  logprob_batch_size: 8
  dtensor_cfg: &DTENSOR
    tensor_parallel_size: 1
    activation_checkpointing: true
teacher:
  <<: *POLICY
  model_name: tiny:teacher
  dtensor_cfg:
    <<: *DTENSOR
    activation_checkpointing: false
"""


def test_merge_keys_load_with_yaml_precedence():
    data = parse_yaml(
        "a: &a {x: 1, y: 2}\n"
        "b: {<<: *a, y: 3}\n"  # the mapping's own key wins
        "c: {<<: [{x: 9}, *a]}\n"  # the first of the list wins
        "d: {<<: {<<: *a, z: 4}}\n",  # a merged mapping may merge
        "test.yaml",
    )
    assert data == {
        "a": {"x": 1, "y": 2},
        "b": {"x": 1, "y": 3},
        "c": {"x": 9, "y": 2},
        "d": {"x": 1, "y": 2, "z": 4},
    }
    # what PyYAML's own reading of merge keys gives
    assert data == yaml.safe_load(
        "a: &a {x: 1, y: 2}\nb: {<<: *a, y: 3}\nc: {<<: [{x: 9}, *a]}\nd: {<<: {<<: *a, z: 4}}\n"
    )


def test_a_config_with_merge_keys_loads(write_yaml):
    cfg = load_config(write_yaml("merged.yaml", MERGED))
    assert cfg.teacher.model_name == "tiny:teacher" and cfg.policy.model_name == "tiny:student"
    assert cfg.teacher.logprob_batch_size == 8  # merged from the policy
    assert cfg.policy.dtensor_cfg.activation_checkpointing is True
    assert cfg.teacher.dtensor_cfg.activation_checkpointing is False


def test_merge_keys_in_an_inherited_file(write_yaml):
    base = write_yaml("base/merged.yaml", MERGED)
    child = write_yaml("child.yaml", f"defaults: {base}\nteacher:\n  logprob_batch_size: 4\n")
    cfg = load_config(child)
    assert cfg.teacher.logprob_batch_size == 4 and cfg.policy.logprob_batch_size == 8
    assert cfg.teacher.dtensor_cfg.activation_checkpointing is False


def test_an_override_of_a_merged_value_changes_that_use_only(write_yaml):
    # `teacher: {<<: *POLICY}` shares the policy's sections; an override of one is not the other's
    path = write_yaml("merged.yaml", MERGED)
    composed = compose_config(path, ["policy.dtensor_cfg.tensor_parallel_size=2"])
    assert composed["policy"]["dtensor_cfg"]["tensor_parallel_size"] == 2
    assert composed["teacher"]["dtensor_cfg"]["tensor_parallel_size"] == 1
    aliased = write_yaml("aliased.yaml", f"defaults: {TINY}\n{_ALIASED}")
    composed = compose_config(aliased, ["teacher.sequence_packing.enabled=true"])
    assert composed["policy"]["sequence_packing"]["enabled"] is False
    assert composed["teacher"]["sequence_packing"]["enabled"] is True


_ALIASED = """\
policy:
  sequence_packing: &PACKING {enabled: false}
teacher:
  sequence_packing: *PACKING
"""


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("a: 1\nb: 2\na: 3\n", "3:1: invalid YAML: duplicate key 'a' (first defined on line 1)"),
        ("a: &a {x: 1}\nb: {<<: *a, y: 1, y: 2}\n", "duplicate key 'y' (first defined on line 2)"),
        ("a: {<<: 3}\n", "a merge key (<<) takes a mapping or a list of mappings"),
        ("a: {<<: [{x: 1}, [2]]}\n", "not a sequence"),
        ("a: &a {<<: *a}\n", "a merge key (<<) includes the mapping it is in"),
    ],
)
def test_bad_merge_keys_are_refused_with_the_place(write_yaml, text, problem):
    path = write_yaml("bad.yaml", text)
    with pytest.raises(ConfigError) as error:
        compose_config(path)
    message = str(error.value)
    assert message.startswith(str(path)) and problem in message, message


def test_a_key_merged_and_also_written_is_not_a_duplicate():
    assert parse_yaml("a: &a {x: 1}\nb: {<<: *a, x: 2}\n", "t")["b"] == {"x": 2}


def merge_bomb(levels: int) -> str:
    """Each mapping merges the previous one ten times, with a key of its own: 10**levels pairs
    where every merge copies every pair (PyYAML before 6.0.2)."""
    lines = ["a0: &a0 {k0: 0}"]
    for i in range(1, levels):
        uses = ", ".join([f"*a{i - 1}"] * 10)
        lines.append(f"a{i}: &a{i} {{<<: [{uses}], k{i}: {i}}}")
    return "\n".join(lines) + "\n"


def fan_out(keys: int, uses: int) -> str:
    """One mapping of `keys` keys merged into `uses` mappings: keys x uses pairs copied. At
    2,000 x 2,000 (55 kB) PyYAML's own reading took 3 s and 190 MiB."""
    lines = ["a: &a {" + ", ".join(f"k{i}: {i}" for i in range(keys)) + "}"]
    lines += [f"b{i}: {{<<: *a}}" for i in range(uses)]
    return "\n".join(lines) + "\n"


def test_nested_merges_copy_each_pair_once():
    start = time.thread_time()  # this thread's CPU time: holds on a loaded machine too
    data = parse_yaml(merge_bomb(40), "nested.yaml")
    assert time.thread_time() - start < 1.0
    assert data["a39"] == {f"k{i}": i for i in range(40)}


def test_a_mapping_merged_too_often_is_refused_at_once(write_yaml):
    path = write_yaml("bomb.yaml", f"defaults: {TINY}\n{fan_out(keys=2_000, uses=2_000)}")
    # This thread's CPU time: the bound holds on a loaded machine, and other threads of the
    # test process (a pool's, a library's) do not count against it
    start = time.thread_time()
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert time.thread_time() - start < 2.0
    message = str(error.value)
    assert message.startswith(f"{path}:53:")  # b50, the 51st use: past 100,000 pairs
    assert f"more than {MAX_VALUES:,} values once YAML merge keys (<<) are expanded" in message


def test_a_merge_key_bomb_through_the_command_line(tmp_path):
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"defaults: {TINY}\n{fan_out(keys=2_000, uses=2_000)}", encoding="utf-8")
    err = assert_refused(run_cli(tmp_path, [str(bomb), "--print-config"]))
    assert "merge keys (<<)" in err


def test_merges_nested_past_the_depth_bound_are_refused():
    lines = ["a0: &a0 {k: 0}"]
    lines += [f"a{i}: &a{i} {{<<: *a{i - 1}}}" for i in range(1, MAX_DEPTH + 2)]
    # Each anchor's mapping is expanded when it is read, so a chain in document order is a
    # chain of one level; one mapping that nests its merges inline is not.
    inline = "x: " + "{<<: " * (MAX_DEPTH + 1) + "{k: 0}" + "}" * (MAX_DEPTH + 1) + "\n"
    assert parse_yaml("\n".join(lines), "chain.yaml")[f"a{MAX_DEPTH + 1}"] == {"k": 0}
    with pytest.raises(ConfigError) as error:
        parse_yaml(inline, "inline.yaml")
    assert f"merge keys (<<) nested more than {MAX_DEPTH} deep" in str(error.value)
