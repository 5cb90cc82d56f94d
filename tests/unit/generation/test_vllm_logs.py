"""vLLM's log volume in the worker: warnings and errors only unless the user chose a level, and
the one warning dropped (rotary embeddings 'failing' to reload: they hold no checkpoint weight)."""

import logging
import os

import pytest

from nemo_opd.generation.vllm_worker import _RotaryReloadFilter, quiet_vllm_logs


@pytest.mark.parametrize(
    ("variable", "default", "users"),
    [
        # vLLM re-reads VLLM_LOGGING_LEVEL whenever it (re)configures logging, e.g. in LLM().
        ("VLLM_LOGGING_LEVEL", "WARNING", "DEBUG"),
        # standard error is what a run in one process keeps in workers.log
        # (utils/worker_output.py)
        ("VLLM_LOGGING_STREAM", "ext://sys.stderr", "ext://sys.stdout"),
    ],
)
def test_vllm_logging_default_unless_the_user_chose(monkeypatch, variable, default, users):
    monkeypatch.delenv(variable, raising=False)
    quiet_vllm_logs()
    assert os.environ[variable] == default
    monkeypatch.setenv(variable, users)
    quiet_vllm_logs()
    assert os.environ[variable] == users


def record(layer: str, msg: str = "%s: Failed to load weights") -> logging.LogRecord:
    return logging.LogRecord("vllm", logging.WARNING, __file__, 1, msg, (layer,), None)


def test_rotary_reload_warning_is_dropped_and_others_kept():
    drop = _RotaryReloadFilter()
    assert not drop.filter(record("RotaryEmbedding"))
    assert not drop.filter(record("Llama3RotaryEmbedding"))
    assert drop.filter(record("QKVParallelLinear"))
    assert drop.filter(record("RotaryEmbedding", "%s: something else"))
    plain = logging.LogRecord("vllm", logging.WARNING, __file__, 1, "no args", None, None)
    assert drop.filter(plain)
