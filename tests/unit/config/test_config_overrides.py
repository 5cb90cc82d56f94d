"""Overrides in Hydra's grammar: every form, the values, and every error case."""

import pytest

from nemo_opd.config import ConfigError, apply_overrides, load_config, parse_override

BASE = {
    "policy": {
        "model_name": "m",
        "optimizer": {"lr": 0.1},
        "scheduler": None,
        "generation": {"stop_strings": ["a"]},
    },
    "loss_fn": {"kl_type": "reverse"},
}


def apply(*overrides):
    return apply_overrides(BASE, overrides)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("policy.model_name=other", "other"),
        ("policy.model_name='123'", "123"),
        ('policy.model_name="true"', "true"),
        ("policy.model_name=", ""),
        ("policy.model_name=null", None),
        ("policy.model_name=true", True),
        ("policy.model_name=3", 3),
        ("policy.model_name=1e-5", 1e-5),
        ("policy.model_name=2.5", 2.5),
        ("policy.model_name=[1, 2]", [1, 2]),
        ("policy.model_name=[1,2]", [1, 2]),
        ("policy.model_name={x: 1, y: [a]}", {"x": 1, "y": ["a"]}),
        ("policy.model_name='a=b'", "a=b"),
        ("policy.model_name=tiny:student", "tiny:student"),
        ("policy.model_name=http://h:8000/v1", "http://h:8000/v1"),
        ("policy.model_name=${n}", "${n}"),
        ("policy.model_name='${mul:${n},2}'", "${mul:${n},2}"),
        ("policy.model_name=yes", "yes"),  # a string, unlike YAML 1.1's true
        ("policy.model_name=1:2", "1:2"),  # a string, unlike YAML 1.1's 62
        ("policy.model_name=inf", float("inf")),
    ],
)
def test_set_parses_values(text, value):
    result = apply(text)["policy"]["model_name"]
    assert result == value
    assert type(result) is type(value)


def test_overrides_do_not_mutate_the_input_and_apply_in_order():
    result = apply("loss_fn.kl_type=forward", "loss_fn.kl_type=jsd")
    assert result["loss_fn"]["kl_type"] == "jsd"
    assert BASE["loss_fn"]["kl_type"] == "reverse"


def test_set_list_replaces_whole_list():
    assert apply("policy.generation.stop_strings=[x, y]")["policy"]["generation"] == {
        "stop_strings": ["x", "y"]
    }


def test_set_accepts_schema_keys_absent_from_the_yaml():
    result = apply("loss_fn.jsd_beta=0.3", "policy.megatron_cfg.enabled=true")
    assert result["loss_fn"]["jsd_beta"] == 0.3
    assert result["policy"]["megatron_cfg"] == {"enabled": True}


def test_set_under_a_null_section_creates_it():
    result = apply("policy.scheduler.warmup_steps=5")
    assert result["policy"]["scheduler"] == {"warmup_steps": 5}


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("policy.optimizer.lrr=1", "unknown key policy.optimizer.lrr; did you mean 'lr'?"),
        ("polcy.model_name=x", "unknown key polcy; did you mean 'policy'?"),
        ("loss_fn.kl_typ=jsd", "unknown key loss_fn.kl_typ; did you mean 'kl_type'?"),
        ("policy.generation.stop_strings.x=1", "policy.generation.stop_strings is ['a']"),
        ("policy.model_name.x=1", "policy.model_name is 'm', not a section"),
    ],
)
def test_set_errors(text, fragment):
    with pytest.raises(ConfigError) as info:
        apply(text)
    assert str(info.value) == f"override {text!r}: " + str(info.value).split(": ", 1)[1]
    assert fragment in str(info.value)


def test_add_new_key_and_new_section():
    result = apply("+policy.optimizer.eps=1e-6", "+env.math.num_workers=2")
    assert result["policy"]["optimizer"] == {"lr": 0.1, "eps": 1e-6}
    assert result["env"] == {"math": {"num_workers": 2}}


def test_add_existing_key_is_an_error():
    with pytest.raises(ConfigError, match=r"policy\.optimizer\.lr is already set \(to 0\.1\)"):
        apply("+policy.optimizer.lr=1")


def test_force_sets_or_adds():
    result = apply("++policy.optimizer.lr=0.5", "++policy.optimizer.eps=1e-6", "++new.deep.key=1")
    assert result["policy"]["optimizer"] == {"lr": 0.5, "eps": 1e-6}
    assert result["new"] == {"deep": {"key": 1}}


def test_delete():
    assert "optimizer" not in apply("~policy.optimizer")["policy"]
    assert "lr" not in apply("~policy.optimizer.lr")["policy"]["optimizer"]


def test_delete_with_matching_value():
    assert "kl_type" not in apply("~loss_fn.kl_type=reverse")["loss_fn"]
    assert (
        "stop_strings" not in apply("~policy.generation.stop_strings=[a]")["policy"]["generation"]
    )


def test_delete_with_other_value_is_refused():
    with pytest.raises(ConfigError, match=r"not deleted: loss_fn\.kl_type is 'reverse', not 'jsd'"):
        apply("~loss_fn.kl_type=jsd")


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        (
            "~policy.optimizer.lrr",
            "cannot delete policy.optimizer.lrr: it is not set; did you mean 'lr'?",
        ),
        (
            "~policy.scheduler.name",
            "cannot delete policy.scheduler.name: policy.scheduler is not set",
        ),
        ("~polcy.x", "polcy is not set; did you mean 'policy'?"),
    ],
)
def test_delete_errors(text, fragment):
    with pytest.raises(ConfigError) as info:
        apply(text)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("policy.model_name", "has no '=': write key=value (or ~key to delete a key)"),
        ("+policy.model_name", "has no '='"),
        ("=3", "has an empty key"),
        ("+=3", "has an empty key"),
        ("~", "has an empty key"),
        ("policy..lr=1", "'policy..lr' is not a key path"),
        ("policy.lr x=1", "'policy.lr x' is not a key path"),
        ("policy.model_name=[1, 2", "cannot read the value '[1, 2' (no viable alternative"),
        ("policy.model_name={a: 1", "cannot read the value '{a: 1'"),
        ("policy.model_name=a=b", "quote a value that holds ="),
        ("policy.model_name=${mul:${n},2}", "key='${mul:${a},2}'"),
        ("policy.model_name=é", "cannot read the value 'é'"),
        ("policy.model_name=1,2", "'1,2' is a Hydra sweep (multirun)"),
        ("policy.model_name=choice(1,2)", "is a Hydra sweep"),
        ("policy.model_name=range(3)", "is a Hydra sweep"),
        ("policy/model=x", "config groups (a/b=c) and packages (a@p=c) are Hydra's"),
        ("policy.model_name@pkg=x", "config groups (a/b=c) and packages (a@p=c) are Hydra's"),
    ],
)
def test_malformed_overrides(text, fragment):
    with pytest.raises(ConfigError) as info:
        apply(text)
    assert f"override {text!r}" in str(info.value)
    assert fragment in str(info.value)


def test_parse_override_fields():
    override = parse_override("++policy.optimizer.lr=1e-4")
    assert (override.operation, override.path, override.value) == (
        "force",
        ("policy", "optimizer", "lr"),
        1e-4,
    )
    assert override.key == "policy.optimizer.lr"


def test_overrides_end_to_end(write_yaml, minimal):
    path = write_yaml("c.yaml", minimal)
    cfg = load_config(
        path,
        [
            "loss_fn.kl_type=mixed",
            "loss_fn.mixed_kl_weight=0.25",
            "policy.generation.stop_strings=['</answer>']",
            "~checkpointing.enabled",
            "checkpointing.save_period=5",
            "distillation.val_period=5",
            "++logger.wandb={project: p, mode: offline}",
        ],
    )
    assert cfg.loss_fn.kl_type == "mixed" and cfg.loss_fn.mixed_kl_weight == 0.25
    assert cfg.policy.generation.stop_strings == ["</answer>"]
    assert cfg.checkpointing.enabled is True  # deleted, so back to the schema default
    assert cfg.logger.wandb.project == "p" and cfg.logger.wandb.mode == "offline"


def test_overridden_bad_value_fails_validation_with_the_key_path(write_yaml, minimal):
    path = write_yaml("c.yaml", minimal)
    with pytest.raises(
        ConfigError, match=r"^loss_fn\.temperature: must be greater than 0; got -1$"
    ):
        load_config(path, ["loss_fn.temperature=-1"])


def test_single_string_is_not_a_list_of_overrides(write_yaml, minimal):
    with pytest.raises(TypeError):
        load_config(write_yaml("c.yaml", minimal), "loss_fn.kl_type=jsd")
