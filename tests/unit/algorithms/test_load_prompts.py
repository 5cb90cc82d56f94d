"""The prompts setup loads (algorithms/setup.py's load_prompts): validation prompts only where
the run validates."""

import json
from pathlib import Path

import pytest

from nemo_opd.algorithms.prompts import load_prompts, start_loading_prompts
from nemo_opd.config import load_config
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.errors import SetupError

TINY = Path(__file__).parents[3] / "examples/configs/distillation_tiny.yaml"
VALIDATION_OFF = (
    "distillation.val_period=0",
    "distillation.val_at_start=false",
    "distillation.val_at_end=false",
    "checkpointing.metric_name=null",
)


def _train_file(tmp_path: Path, rows: int) -> Path:
    path = tmp_path / "train.jsonl"
    lines = [json.dumps({"prompt": f"What is {i} + 1?", "answer": i + 1}) for i in range(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_validation_off_needs_no_validation_data(chat_tokenizer, tmp_path):
    # Local training prompts and no validation source: fine when the run never validates.
    train = _train_file(tmp_path, 40)
    local = ("data.dataset_name=null", f"data.train_path={train}")
    cfg = load_config(TINY, [*local, *VALIDATION_OFF])
    _, train_prompts, val_prompts = load_prompts(cfg, chat_tokenizer)
    assert len(train_prompts.samples) == 40
    assert val_prompts.samples == [] and val_prompts.skipped == 0


def test_validation_on_without_validation_data_says_what_to_set(chat_tokenizer, tmp_path):
    train = _train_file(tmp_path, 40)
    cfg = load_config(TINY, ["data.dataset_name=null", f"data.train_path={train}"])
    assert cfg.distillation.validates
    with pytest.raises(SetupError) as refused:
        load_prompts(cfg, chat_tokenizer)
    assert str(refused.value) == (
        "no validation data: set data.val_path or data.val_dataset_name, or validate not at all "
        "(distillation.val_period 0, val_at_start and val_at_end false)"
    )


def test_prompts_tokenized_in_the_background_equal_load_prompts(chat_tokenizer, tmp_path):
    train = _train_file(tmp_path, 40)
    local = ("data.dataset_name=null", f"data.train_path={train}")
    cfg = load_config(TINY, [*local, *VALIDATION_OFF])
    finish = start_loading_prompts(cfg, chat_tokenizer)
    _, started, _ = finish()
    _, loaded, _ = load_prompts(cfg, chat_tokenizer)
    assert started.samples == loaded.samples and len(started.samples) == 40


def test_prompts_all_too_long_are_refused_when_the_tokenized_prompts_are_asked_for(
    chat_tokenizer, tmp_path
):
    train = _train_file(tmp_path, 40)
    local = ("data.dataset_name=null", f"data.train_path={train}", "data.max_input_seq_length=2")
    finish = start_loading_prompts(load_config(TINY, [*local, *VALIDATION_OFF]), chat_tokenizer)
    with pytest.raises(SetupError, match="train: all 40 prompts are longer than 2 tokens"):
        finish()


def test_a_second_load_reads_the_cached_ids_unless_turned_off(
    chat_tokenizer, tmp_path, monkeypatch
):
    """The loop's prompts go through the cache in $NEMO_OPD_CACHE/prompts: the second load
    renders nothing and gives the same samples; data.cache_encoded_prompts=false renders every
    time and stores nothing."""
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "cache"))
    train = _train_file(tmp_path, 40)
    local = ("data.dataset_name=null", f"data.train_path={train}")
    cfg = load_config(TINY, [*local, *VALIDATION_OFF])
    _, first, _ = load_prompts(cfg, chat_tokenizer)
    assert len(list((tmp_path / "cache" / "prompts").glob("*.npz"))) == 1
    rendered = []
    original = ChatFormatter._render
    monkeypatch.setattr(
        ChatFormatter, "_render", lambda self, *a: rendered.append(1) or original(self, *a)
    )
    _, second, _ = load_prompts(cfg, chat_tokenizer)
    assert second.samples == first.samples and not rendered
    off = load_config(TINY, [*local, *VALIDATION_OFF, "data.cache_encoded_prompts=false"])
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "other"))
    _, third, _ = load_prompts(off, chat_tokenizer)
    assert third.samples == first.samples and rendered
    assert not (tmp_path / "other").exists()
