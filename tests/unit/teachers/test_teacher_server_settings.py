"""What `python -m nemo_opd.teacher_server` starts vLLM with, from a config and its flags (the
real server is started in tests/functional/test_served_teacher_loop.py)."""

from pathlib import Path

import pytest

from nemo_opd.config import ConfigError, load_config
from nemo_opd.teacher_server import (
    EXIT_CONFIG_ERROR,
    build_parser,
    main,
    server_command,
    server_env,
    settings_from_config,
)
from nemo_opd.teachers.server_key import server_api_key
from nemo_opd.tiny.assets import resolve_pretrained

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"


def settings(config: str, *argv: str, overrides=()):
    args = build_parser().parse_intermixed_args(["--config", config, *argv])
    return settings_from_config(load_config(CONFIGS / config, list(overrides)), args)


def flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_the_tiny_teacher_from_the_config():
    got = settings("distillation_tiny.yaml")
    cfg = load_config(CONFIGS / "distillation_tiny.yaml")
    assert got.model == resolve_pretrained("tiny:teacher")
    assert got.served_model_name == "tiny:teacher"
    assert got.max_logprobs == cfg.distillation.topk_logits_k
    assert got.max_model_len == cfg.policy.max_total_sequence_length + 1
    assert got.kv_cache_memory_bytes == cfg.policy.generation.vllm_cfg.kv_cache_memory_bytes
    command = server_command(got)
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert flag(command, "--dtype") == cfg.teacher.precision
    assert flag(command, "--kv-cache-memory-bytes") == str(got.kv_cache_memory_bytes)
    assert "--enforce-eager" in command
    assert got.base_url == "http://127.0.0.1:8000/v1"


def test_flags_and_overrides_win():
    got = settings(
        "distillation_tiny.yaml",
        "--port",
        "9123",
        "--served-model-name",
        "t",
        "--kv-cache-memory-bytes",
        "1048576",
        overrides=["distillation.topk_logits_k=8"],
    )
    assert (got.port, got.served_model_name, got.max_logprobs) == (9123, "t", 8)
    command = server_command(got)
    assert flag(command, "--kv-cache-memory-bytes") == "1048576"
    assert (flag(command, "--served-model-name"), flag(command, "--max-logprobs")) == ("t", "8")
    assert flag(command, "--port") == "9123"


def test_a_config_sized_by_memory_fraction_passes_no_kv_size():
    got = settings("distillation_math.yaml", "--gpu-memory-utilization", "0.85")
    command = server_command(got)
    assert "--kv-cache-memory-bytes" not in command
    assert flag(command, "--gpu-memory-utilization") == "0.85"


def test_a_config_without_a_teacher_exits_2(capsys):
    status = main(["--config", str(CONFIGS / "grpo_tiny.yaml")])
    assert status == EXIT_CONFIG_ERROR
    assert "the config has no teacher" in capsys.readouterr().err


def test_a_config_without_one_teacher_has_nothing_to_serve():
    with pytest.raises(ConfigError, match="several teachers .* not supported yet"):
        settings("distillation_tiny_routed.yaml")
    with pytest.raises(ConfigError, match="no teacher"):
        settings("grpo_tiny.yaml")


def test_the_context_is_the_teachers_own_length():
    """A teacher with its own prompt scores rows longer than the student's: the server's
    context follows teacher.max_total_sequence_length, not the policy's."""
    got = settings("distillation_tiny.yaml", overrides=["teacher.max_total_sequence_length=200"])
    assert got.max_model_len == 201


def test_an_api_key_reaches_the_server_by_its_environment_only(monkeypatch):
    monkeypatch.setenv("NEMO_OPD_SERVER_KEY", "sk-for-the-server")
    overrides = ["teacher.server.api_key_env=NEMO_OPD_SERVER_KEY"]
    cfg = load_config(CONFIGS / "distillation_tiny.yaml", overrides)
    key = server_api_key(cfg.teacher.server)
    command = server_command(settings("distillation_tiny.yaml", overrides=overrides))
    assert key not in " ".join(command)
    assert server_env(key)["VLLM_API_KEY"] == key
    assert server_env(None) is None


def test_the_command_imports_neither_torch_nor_transformers():
    """The command validates the config and starts vLLM's server, whose processes import what
    they need: its own start-up imports no model library (seconds of each server start)."""
    import subprocess
    import sys

    probe = (
        "import sys, nemo_opd.teacher_server; "
        "print(sorted({'torch', 'transformers', 'vllm'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
