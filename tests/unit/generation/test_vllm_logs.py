"""vLLM's log volume in the worker: warnings and errors only unless the user chose a level, and
the one warning dropped (rotary embeddings 'failing' to reload: they hold no checkpoint weight)."""

import logging
import os

from nemo_opd.generation.vllm_worker import _RotaryReloadFilter, quiet_vllm_logs


def test_vllm_level_is_warning_unless_the_user_chose_one(monkeypatch):
    # vLLM re-reads VLLM_LOGGING_LEVEL whenever it (re)configures logging, e.g. in LLM().
    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    quiet_vllm_logs()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "WARNING"
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    quiet_vllm_logs()
    assert os.environ["VLLM_LOGGING_LEVEL"] == "DEBUG"


def test_vllm_logs_to_standard_error_unless_the_user_chose(monkeypatch):
    # standard error is what a run in one process keeps in workers.log (utils/worker_output.py)
    monkeypatch.delenv("VLLM_LOGGING_STREAM", raising=False)
    quiet_vllm_logs()
    assert os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stderr"
    monkeypatch.setenv("VLLM_LOGGING_STREAM", "ext://sys.stdout")
    quiet_vllm_logs()
    assert os.environ["VLLM_LOGGING_STREAM"] == "ext://sys.stdout"


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
