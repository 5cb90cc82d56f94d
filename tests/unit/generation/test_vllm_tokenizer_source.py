"""Which directory vLLM gets as its tokenizer: the model directory only when it holds the same
tokenizer as a config-less tokenizer directory (vLLM otherwise retries reading a model config
from the tokenizer directory, logging errors and sleeping 2 s)."""

import json

from nemo_opd.generation.vllm_worker import vllm_tokenizer_source

TOKENIZER = {"version": "1.0", "truncation": None, "padding": None, "model": {"vocab": {"a": 0}}}


def write(directory, tokenizer: dict, template: str = "{{ messages }}", config: bool = False):
    directory.mkdir()
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer))
    (directory / "tokenizer_config.json").write_text('{"eos_token": "a"}')
    (directory / "chat_template.jinja").write_text(template)
    if config:
        (directory / "config.json").write_text('{"model_type": "qwen3"}')
    return str(directory)


def test_model_directory_with_the_same_tokenizer_is_used(tmp_path):
    tokenizer = write(tmp_path / "tokenizer", TOKENIZER)
    # the model's copy was saved with padding enabled: a call-time setting, same vocabulary
    padded = {**TOKENIZER, "padding": {"strategy": "BatchLongest", "pad_id": 0}}
    model = write(tmp_path / "model", padded, config=True)
    assert vllm_tokenizer_source(tokenizer, model) == model


def test_tokenizer_directory_is_kept_otherwise(tmp_path):
    tokenizer = write(tmp_path / "tokenizer", TOKENIZER)
    other_vocab = write(tmp_path / "other", {**TOKENIZER, "model": {"vocab": {"b": 0}}})
    other_template = write(tmp_path / "template", TOKENIZER, template="{{ other }}")
    assert vllm_tokenizer_source(tokenizer, other_vocab) == tokenizer
    assert vllm_tokenizer_source(tokenizer, other_template) == tokenizer
    assert vllm_tokenizer_source(tokenizer, str(tmp_path / "missing")) == tokenizer
    with_config = write(tmp_path / "with_config", TOKENIZER, config=True)
    model = write(tmp_path / "model", TOKENIZER, config=True)
    assert vllm_tokenizer_source(with_config, model) == with_config
    assert vllm_tokenizer_source("Qwen/Qwen3-4B", model) == "Qwen/Qwen3-4B"
    assert vllm_tokenizer_source(None, model) == model
