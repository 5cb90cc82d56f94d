"""Schema validation errors: one ConfigError, one line per problem, full key paths, values."""

import pytest
from config_errors import error_of
from pydantic import BaseModel

from nemo_opd.config import ConfigError, DistillationConfig, PolicyConfig, validate_config
from nemo_opd.config.key_paths import section_model


def _section(config: dict, path) -> dict:
    """The dict at `path`, creating empty (or replacing null) sections on the way."""
    for part in path:
        if config.get(part) is None:
            config[part] = {}
        config = config[part]
    return config


def test_minimal_config_is_valid(minimal):
    cfg = validate_config(minimal)
    assert isinstance(cfg.policy, PolicyConfig) and isinstance(cfg.teacher, PolicyConfig)
    assert cfg.loss_fn.kl_type == "reverse" and cfg.loss_fn.tail == "bucket"
    assert cfg.checkpointing.metric_name == "validation/accuracy"
    assert cfg.cluster.world_size == 2


def test_sections_validate_on_their_own(minimal):
    policy = PolicyConfig.model_validate(minimal["policy"])
    assert policy.backend == "dtensor" and policy.model_parallel_size == 1
    assert policy.tokenizer.name == "tiny:tokenizer"


@pytest.mark.parametrize(
    ("path", "bad_key", "suggestion"),
    [
        ((), "polcy", "policy"),
        ((), "loss", "loss_fn"),
        (("policy",), "model_nam", "model_name"),
        (("policy", "optimizer"), "learning_rate", None),
        (("policy", "generation", "vllm_cfg"), "gpu_memory_utilisation", "gpu_memory_utilization"),
        (("distillation",), "topk_logit_k", "topk_logits_k"),
    ],
)
def test_unknown_key_is_rejected_with_a_suggestion(minimal, path, bad_key, suggestion):
    _section(minimal, path)[bad_key] = 1
    message = error_of(minimal)
    full = ".".join((*path, bad_key))
    if suggestion:
        assert message == f"{full}: unknown key; did you mean '{suggestion}'?"
    else:
        assert message.startswith(f"{full}: unknown key; valid keys here: name, lr,")


def _all_sections(model: type[BaseModel], path=()):
    yield path, model
    for name, field in model.model_fields.items():
        sub = section_model(field.annotation)
        if sub is not None:
            yield from _all_sections(sub, (*path, name))


@pytest.mark.parametrize(
    "path", [p for p, _ in _all_sections(DistillationConfig)], ids=lambda p: ".".join(p) or "<root>"
)
def test_every_section_forbids_unknown_keys(minimal, path):
    section = _section(minimal, path)
    section["surely_not_a_key"] = 1
    assert f"{'.'.join((*path, 'surely_not_a_key'))}: unknown key" in error_of(minimal)


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (
            ("policy", "dtensor_cfg", "tensor_parallel_size"),
            0,
            "policy.dtensor_cfg.tensor_parallel_size: must be greater than or equal to 1; got 0",
        ),
        (
            ("policy", "train_global_batch_size"),
            "many",
            "policy.train_global_batch_size: must be a valid integer, unable to parse string as an "
            "integer; got 'many'",
        ),
        (
            ("policy", "train_micro_batch_size"),
            2.5,
            "policy.train_micro_batch_size: must be a valid integer, not a number with a "
            "fractional part; got 2.5",
        ),
        (
            ("policy", "precision"),
            "bf16",
            "policy.precision: must be 'float32', 'bfloat16' or 'float16'; got 'bf16' "
            "(did you mean 'bfloat16'?)",
        ),
        (
            ("loss_fn", "kl_type"),
            "kl",
            "loss_fn.kl_type: must be 'forward', 'reverse', 'mixed' or 'jsd'; got 'kl'",
        ),
        (
            ("loss_fn", "mixed_kl_weight"),
            1.5,
            "loss_fn.mixed_kl_weight: must be less than or equal to 1; got 1.5",
        ),
        (
            ("loss_fn", "jsd_beta"),
            -0.1,
            "loss_fn.jsd_beta: must be greater than or equal to 0; got -0.1",
        ),
        (("loss_fn", "temperature"), 0, "loss_fn.temperature: must be greater than 0; got 0"),
        (
            ("distillation", "topk_logits_k"),
            0,
            "distillation.topk_logits_k: must be greater than or equal to 1; got 0",
        ),
        (
            ("policy", "optimizer", "betas"),
            [0.9, 1.0],
            "policy.optimizer.betas[1]: must be less than 1; got 1.0",
        ),
        (
            ("policy", "optimizer", "betas"),
            [0.9],
            "policy.optimizer.betas[1]: required key is missing",
        ),
        (
            ("policy", "generation", "vllm_cfg", "gpu_memory_utilization"),
            1.2,
            "policy.generation.vllm_cfg.gpu_memory_utilization: must be less than or equal to 1; "
            "got 1.2",
        ),
        (
            ("cluster", "device"),
            "gpu",
            "cluster.device: must be 'auto', 'cuda' or 'cpu'; got 'gpu' (did you mean 'cpu'?)",
        ),
        (
            ("policy", "dtensor_cfg", "enabled"),
            "maybe",
            "policy.dtensor_cfg.enabled: must be a valid boolean, unable to interpret input; "
            "got 'maybe'",
        ),
        (
            ("policy", "tokenizer"),
            "tiny:tokenizer",
            "policy.tokenizer: must be a section (a mapping of keys); got 'tiny:tokenizer'",
        ),
        (("policy", "model_name"), "", "policy.model_name: must have at least 1 character; got ''"),
        # a URL's user-info is never echoed, even when the URL is malformed
        (
            ("teacher", "server", "base_url"),
            "alice:s3cr3t@host/v1",
            "teacher.server.base_url: must be an http(s) URL with a host, e.g. "
            "http://127.0.0.1:8000/v1 (the server's OpenAI base URL); got '***@host/v1'",
        ),
        (
            ("teacher", "server", "base_url"),
            "http://alice:s3 cr3t@host/v1",
            "teacher.server.base_url: must be a URL without spaces or control characters; got "
            "'http://***@host/v1'",
        ),
        (
            ("teacher", "server", "base_url"),
            "http://alice:s3?cr3t@host/v1",
            "teacher.server.base_url: has a port that is not a number from 0 to 65535 (a "
            "password that holds /, ? or # must be percent-encoded: %2F, %3F, %23); got "
            "'http://***@host/v1'",
        ),
    ],
)
def test_bad_values_name_the_full_path_and_value(minimal, path, value, expected):
    _section(minimal, path[:-1])[path[-1]] = value
    assert error_of(minimal) == expected


def test_missing_required_keys_and_sections(minimal):
    del minimal["policy"]["model_name"]
    del minimal["data"]
    message = error_of(minimal)
    assert message.splitlines() == [
        "invalid configuration (2 problems):",
        "  policy.model_name: required key is missing",
        "  data: required key is missing",
    ]


def test_all_problems_are_listed_one_per_line(minimal):
    minimal["policy"]["precision"] = "fp8"
    minimal["teacher"]["max_total_sequence_length"] = -1
    minimal["logger"] = {"wandb": {"mode": "sometimes"}, "log_dirr": "x"}
    lines = error_of(minimal).splitlines()
    assert lines[0] == "invalid configuration (4 problems):"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "policy.precision",
        "teacher.max_total_sequence_length",
        "logger.wandb.mode",
        "logger.log_dirr",
    ]
    assert "Traceback" not in "\n".join(lines) and "pydantic" not in "\n".join(lines)


def test_scalar_instead_of_config(minimal):
    with pytest.raises(ConfigError):
        validate_config({"policy": 3})


def test_tiny_model_names_are_plain_strings(minimal):
    cfg = validate_config(minimal)
    assert cfg.policy.model_name == "tiny:student" and cfg.teacher.model_name == "tiny:teacher"
