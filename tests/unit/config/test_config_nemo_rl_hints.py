"""A NeMo-RL config loaded as it is: every key NeMo-RL users know says what it became here (or
that it has none, and why), the message points to the converter, and the closest-key
suggestion never proposes a key of another meaning.

Before, 84 problems came with hints such as generation_batch_size -> train_micro_batch_size,
logprob_chunk_size -> logprob_batch_size and save_optimizer -> save_period.
"""

from pathlib import Path

import pytest
from nemo_rl_configs import FIXTURE_CONFIGS, published_configs

from nemo_opd.config import ConfigError, load_config, validate_config
from nemo_opd.config.errors import closest_key
from nemo_opd.config.interpolation import resolve_interpolations
from nemo_opd.config.loader import describe_validation_error, load_with_defaults
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.nemo_rl_keys import CONVERTER, KEY_MAP, fate_of

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def every_problem(path: Path) -> list[str]:
    """Every problem of a config (not only the first MAX_PROBLEMS_SHOWN)."""
    data = resolve_interpolations(load_with_defaults(path))
    try:
        DistillationConfig.model_validate(data)
    except Exception as error:  # pydantic's ValidationError
        return describe_validation_error(error, {})
    return []


def assert_every_key_is_explained(path: Path) -> None:
    problems = every_problem(path)
    assert problems, f"{path} loads as it is"
    for problem in problems:
        if "NeMo-RL's" in problem:
            assert "did you mean" not in problem, problem
        else:  # what is left: a required key NeMo-RL spells elsewhere (optimizer.kwargs.lr)
            assert problem.endswith("optimizer.lr: required key is missing"), problem
    with pytest.raises(ConfigError) as error:
        load_config(path)
    assert (
        str(error.value)
        .splitlines()[-1]
        .endswith(
            f"NeMo-RL's: `{CONVERTER}` converts a NeMo-RL config and prints what each key became "
            "(docs/nemo_rl.md)"
        )
    )


@pytest.mark.parametrize("path", FIXTURE_CONFIGS, ids=lambda p: p.name)
def test_every_key_of_a_nemo_rl_config_is_explained(path):
    assert_every_key_is_explained(path)


def test_every_key_of_nemo_rl_s_published_configs_is_explained(tmp_path):
    for path in published_configs(tmp_path):
        assert_every_key_is_explained(path)


@pytest.mark.parametrize(
    ("key", "value", "says"),
    [
        (
            "policy.generation_batch_size",
            32,
            "NeMo-RL's key, with no equivalent here: vLLM takes each step's prompts at once",
        ),
        (
            "policy.logprob_chunk_size",
            512,
            "NeMo-RL's key; the nearest here is policy.logits_chunk_tokens, which differs",
        ),
        (
            "checkpointing.save_optimizer",
            True,
            "NeMo-RL's key, with no equivalent here: a checkpoint always holds the optimizer",
        ),
        (
            "loss_fn.zero_outside_topk",
            False,
            "NeMo-RL's key; the nearest here is loss_fn.tail, which differs (false is tail: "
            "renormalize",
        ),
        ("policy.optimizer.kwargs", {"lr": 1e-5}, "it is policy.optimizer here"),
        ("teacher.generation_batch_size", 32, "the teacher is frozen and never samples"),
    ],
)
def test_a_nemo_rl_key_says_what_it_became(minimal, key, value, says):
    section, name = key.rsplit(".", 1)
    node = minimal
    for part in section.split("."):
        node = node.setdefault(part, {})
    node[name] = value
    with pytest.raises(ConfigError) as error:
        validate_config(minimal)
    message = str(error.value)
    assert message.startswith(f"{key}: unknown key; ") and says in message, message
    assert "did you mean" not in message
    assert "\n" not in message  # one key from habit: no pointer to converting a whole config
    # and the same from the command line's overrides
    with pytest.raises(ConfigError) as error:
        load_config(TINY, [f"++{key}={value}" if isinstance(value, dict) else f"{key}={value}"])
    if not isinstance(value, dict):  # ++ adds any key; a plain set names the unknown one
        assert says in str(error.value) and "did you mean" not in str(error.value)


def test_a_nemo_rl_value_form_says_what_it_is_here(minimal):
    minimal["policy"]["scheduler"] = [{"name": "torch.optim.lr_scheduler.LinearLR"}]
    message = str(pytest.raises(ConfigError, validate_config, minimal).value)
    assert message.startswith("policy.scheduler: must be a section")
    assert "NeMo-RL's form of the key, which differs here: NeMo-RL's list of torch" in message


@pytest.mark.parametrize(
    ("name", "candidates", "expected"),
    [
        ("generation_batch_size", ["train_micro_batch_size", "logprob_batch_size"], None),
        ("logprob_chunk_size", ["logprob_batch_size", "logits_chunk_tokens"], None),
        ("save_optimizer", ["save_period", "enabled"], None),
        ("tensorboard", ["tensorboard_enabled", "log_dir"], "tensorboard_enabled"),
        ("kl_typ", ["kl_type", "mixed_kl_weight"], "kl_type"),
        ("loss", ["loss_fn", "objective"], "loss_fn"),
        ("topk_logit_k", ["topk_logits_k"], "topk_logits_k"),
        ("num_prompt_per_step", ["num_prompts_per_step"], "num_prompts_per_step"),
        ("lrr", ["lr", "eps"], "lr"),
    ],
)
def test_the_closest_key_is_one_of_the_same_words(name, candidates, expected):
    assert closest_key(name, candidates) == expected


def test_the_map_names_only_keys_of_this_schema():
    from nemo_opd.config.key_paths import has_path

    for pattern, fate in KEY_MAP.items():
        if fate.target is None:
            continue
        for model in ("policy", "teacher"):
            target = fate.target.replace("{model}", model).split(".")
            assert has_path(DistillationConfig, target), (pattern, fate.target)
        if fate.kind == "same":
            assert fate.target == pattern, pattern


def test_a_section_s_entry_covers_its_keys():
    fate = fate_of(["policy", "megatron_cfg", "fp8_cfg", "fp8_recipe"])
    assert fate.kind == "dropped" and fate.note == "no FP8 training"
    frozen = fate_of(["teacher", "optimizer", "kwargs", "lr"])
    assert frozen.kind == "dropped" and "frozen" in frozen.note
    assert fate_of(["policy", "optimizer", "kwargs", "lr"]).target == "policy.optimizer.lr"
