"""The prompts' token ids kept between runs (nemo_opd.data.prompt_cache): a second start reads
what the first rendered and encoded, the same logs to the last id without rendering anything;
every input the ids depend on is part of the key, so a change is a miss, never another
entry's ids; a damaged entry is ignored and replaced; the folder keeps its newest entries; a
folder that cannot be written costs one line, not the run."""

import copy
import os
import time

import numpy as np
import pytest
import real_tokenizers

from nemo_opd.data import prompt_cache
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.prompt_cache import PromptCache, entry_key

PROMPTS = ["What is 2 + 3?", "", "What is 2 + 3?", "A longer one: 17 * 23 - 4 = ?"]
CONVERSATIONS = [
    None,
    [{"role": "system", "content": "Terse."}, {"role": "user", "content": "Add 4 and 5."}],
    None,
    None,
]


def _no_rendering(formatter: ChatFormatter) -> None:
    """Any rendering or encoding from now on fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("rendered or encoded although the cache holds the ids")

    formatter._render = refuse
    formatter._encode_many = refuse


def _start(formatter, cache, prompts=PROMPTS, conversations=CONVERSATIONS):
    return formatter.start_prompt_logs(prompts, conversations, cache=cache)()


def test_a_second_start_reads_the_first_ones_ids_without_rendering(chat_tokenizer, tmp_path):
    cache = PromptCache(tmp_path)
    formatter = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief.")
    fresh = formatter.prompt_logs(PROMPTS, CONVERSATIONS)
    assert _start(formatter, cache) == fresh
    assert len(list(tmp_path.glob("*.npz"))) == 1
    again = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief.")
    _no_rendering(again)
    cached = _start(again, cache)
    assert cached == fresh
    cached[0][1]["token_ids"].append(7)  # every message's ids are its own list
    assert cached[2] == fresh[2]


@pytest.mark.parametrize(
    "change",
    [
        "prompt",
        "conversation",
        "prompt_template",
        "system_prompt",
        "template_kwargs",
        "tools",
        "chat_template",
        "special_token",
        "added_token",
    ],
)
def test_every_input_of_the_ids_is_in_the_key(chat_tokenizer, tmp_path, change):
    """A change to anything the ids depend on is a miss: the prompts are rendered again and
    the logs are the changed inputs' own, equal to an uncached formatter's."""
    cache = PromptCache(tmp_path)
    _start(ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief."), cache)
    tokenizer = copy.deepcopy(chat_tokenizer)
    options = {"prompt_template": "Solve: {}", "system_prompt": "Be brief."}
    prompts, conversations = list(PROMPTS), copy.deepcopy(CONVERSATIONS)
    if change == "prompt":
        prompts[3] = "A longer one: 17 * 23 - 5 = ?"
    elif change == "conversation":
        conversations[1][1]["content"] = "Add 4 and 6."
    elif change == "prompt_template":
        options["prompt_template"] = "Answer: {}"
    elif change == "system_prompt":
        options["system_prompt"] = "Be very brief."
    elif change == "template_kwargs":
        options["template_kwargs"] = {"enable_thinking": False}
    elif change == "tools":
        options["tools"] = [{"type": "function", "function": {"name": "calc"}}]
    elif change == "chat_template":
        tokenizer.chat_template = tokenizer.chat_template.replace("<|im_start|>", "<|im_start|> ")
    elif change == "special_token":
        tokenizer.eos_token = "<|endoftext|>"
    elif change == "added_token":
        tokenizer.add_tokens(["Solve"])
    formatter = ChatFormatter(tokenizer, **options)
    uncached = ChatFormatter(tokenizer, **options).prompt_logs(prompts, conversations)
    assert _start(formatter, cache, prompts, conversations) == uncached
    assert len(list(tmp_path.glob("*.npz"))) == 2


def test_a_template_that_writes_the_date_is_keyed_by_the_day(chat_tokenizer, monkeypatch):
    """A template that asks for the date (Llama 3.1's "Today Date") renders another text each
    day: its entries are the day's; a template that does not is keyed alike every day."""
    dated = copy.deepcopy(chat_tokenizer)
    dated.chat_template = "{{ strftime_now('%d %b %Y') }}" + dated.chat_template
    fingerprints = []
    for day in ("2026-11-30", "2026-12-01"):
        monkeypatch.setattr(time, "strftime", lambda fmt, day=day: day)
        fingerprints.append(
            (ChatFormatter(dated).fingerprint(), ChatFormatter(chat_tokenizer).fingerprint())
        )
    (dated_1, plain_1), (dated_2, plain_2) = fingerprints
    assert dated_1 != dated_2
    assert plain_1 == plain_2


def test_a_formatter_serializes_its_tokenizer_once(chat_tokenizer):
    """The train and the validation prompts of a run share one fingerprint: a real tokenizer's
    definition takes tenths of a second to serialize."""
    formatter = ChatFormatter(chat_tokenizer, system_prompt="Be brief.")
    first = formatter.fingerprint()
    assert first is not None and formatter.fingerprint() is first


def test_a_damaged_entry_is_ignored_and_replaced(chat_tokenizer, tmp_path):
    cache = PromptCache(tmp_path)
    formatter = ChatFormatter(chat_tokenizer, system_prompt="Be brief.")
    fresh = _start(formatter, cache)
    (entry,) = tmp_path.glob("*.npz")
    entry.write_bytes(entry.read_bytes()[:100])
    assert _start(ChatFormatter(chat_tokenizer, system_prompt="Be brief."), cache) == fresh
    with np.load(entry) as stored:  # written whole again
        assert int(stored["lengths"].sum()) == len(stored["ids"])
    # an entry of another length than the logs' messages (a foreign file under the key)
    key = entry_key(formatter.fingerprint(), PROMPTS, CONVERSATIONS)
    assert entry.name == f"{key}.npz"
    cache.store(key, [[1, 2]])
    assert _start(ChatFormatter(chat_tokenizer, system_prompt="Be brief."), cache) == fresh


def test_the_folder_keeps_its_newest_entries(tmp_path, monkeypatch):
    monkeypatch.setattr(prompt_cache, "KEEP", 3)
    cache = PromptCache(tmp_path)
    for index in range(5):
        path = cache.store(f"key{index}", [[index, index + 1], []])
        os.utime(path, (1000 + index, 1000 + index))
    cache.store("key5", [[5]])
    kept = sorted(path.stem for path in tmp_path.glob("*.npz"))
    assert kept == ["key3", "key4", "key5"]
    assert cache.load("key4") == [[4, 5], []]
    assert cache.load("key0") is None
    assert not list(tmp_path.glob(".partial-*"))


def test_a_prune_leaves_an_entry_being_written_and_clears_a_dead_writers(tmp_path):
    """Another run's entry still being written (a partial file) is not an entry to prune; one
    left by a writer that died long ago is deleted."""
    cache = PromptCache(tmp_path)
    writing = tmp_path / f"{prompt_cache.PARTIAL}live.npz"
    abandoned = tmp_path / f"{prompt_cache.PARTIAL}dead.npz"
    writing.write_bytes(b"half")
    abandoned.write_bytes(b"half")
    old = time.time() - prompt_cache.STALE_PARTIAL_S - 60
    os.utime(abandoned, (old, old))
    cache.store("key", [[1]])
    assert writing.exists() and not abandoned.exists()
    assert cache.load("key") == [[1]]


def test_records_that_cannot_be_hashed_are_encoded_every_time(chat_tokenizer, tmp_path):
    class Opaque(dict):  # a message pickle cannot serialize (a lambda inside)
        pass

    message = Opaque(role="user", content="Add 4 and 5.")
    message["hook"] = lambda: None
    conversations = [None, [message], None, None]
    formatter = ChatFormatter(chat_tokenizer, system_prompt="Be brief.")
    assert entry_key(formatter.fingerprint(), PROMPTS, conversations) is None
    logs = _start(formatter, PromptCache(tmp_path), PROMPTS, conversations)
    assert logs == formatter.prompt_logs(PROMPTS, conversations)
    assert not list(tmp_path.glob("*.npz"))


def test_a_folder_that_cannot_be_written_costs_one_line(chat_tokenizer, tmp_path, capsys):
    blocked = tmp_path / "file"
    blocked.write_text("not a folder")
    formatter = ChatFormatter(chat_tokenizer, system_prompt="Be brief.")
    logs = _start(formatter, PromptCache(blocked / "prompts"))
    assert logs == formatter.prompt_logs(PROMPTS, CONVERSATIONS)
    out = capsys.readouterr().out  # one message, wrapped at the terminal's width
    assert out.startswith("data: the prompts' token ids not cached (")
    assert out.count("data:") == 1 and "Not a directory" in out


def test_a_real_tokenizer_reads_back_what_it_encoded(tmp_path):
    """Qwen3's tokenizer and chat template (byte-level BPE, special tokens in the template):
    the cached logs are the rendered ones, id for id."""
    tokenizer = real_tokenizers.load("qwen3")
    prompts = ["Wie viel ist 2 + 3? ", "  spaces  and <|im_end|> text", "数学: 7 × 8"]
    cache = PromptCache(tmp_path)
    fresh = ChatFormatter(tokenizer, system_prompt="Think.").prompt_logs(prompts)
    assert _start(ChatFormatter(tokenizer, system_prompt="Think."), cache, prompts, None) == fresh
    again = ChatFormatter(tokenizer, system_prompt="Think.")
    _no_rendering(again)
    assert _start(again, cache, prompts, None) == fresh
