"""The one vLLM warning the worker drops: rotary embeddings 'failing' to reload (they hold no
checkpoint weight); every other warning passes."""

import logging

from nemo_opd.generation.vllm_worker import _RotaryReloadFilter


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
