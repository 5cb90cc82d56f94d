from pathlib import Path

import pytest

from nemo_opd.data.chat import ChatFormatter, encode_in_background, read_text_file
from nemo_opd.errors import SetupError

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def _ids(log):
    return [t for m in log for t in m["token_ids"]]


def _assistant(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return {
        "role": "assistant",
        "content": tokenizer.decode(ids, skip_special_tokens=True),
        "token_ids": ids,
    }


def _template_ids(tokenizer, log, add_generation_prompt=True):
    messages = [{"role": m["role"], "content": m["content"]} for m in log]
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def test_prompt_log_equals_chat_template(chat_tokenizer):
    formatter = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief.")
    log = formatter.prompt_log("What is 2 + 3?")
    assert [m["role"] for m in log] == ["system", "user"]
    assert log[1]["content"] == "Solve: What is 2 + 3?"
    assert _ids(log) == _template_ids(chat_tokenizer, log)


@pytest.mark.parametrize("system", [None, "Be brief."])
def test_batched_prompt_logs_equal_one_at_a_time(chat_tokenizer, system):
    """prompt_logs tokenizes a dataset in one call; each log equals its prompt_log."""
    formatter = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt=system)
    prompts = ["What is 2 + 3?", "", "A longer one: 17 * 23 - 4 = ?", "x"]
    batched = formatter.prompt_logs(prompts)
    assert batched == [formatter.prompt_log(p) for p in prompts]
    assert [_ids(log) == _template_ids(chat_tokenizer, log) for log in batched] == [True] * 4
    assert formatter.prompt_logs([]) == []


def test_repeated_prompts_get_equal_logs_of_their_own(chat_tokenizer):
    """A dataset's repeated prompts are rendered and encoded once, yet every log is its own:
    changing one leaves the others as they were."""
    formatter = ChatFormatter(chat_tokenizer, system_prompt="Be brief.")
    logs = formatter.prompt_logs(["What is 2 + 3?", "What is 4 + 4?", "What is 2 + 3?"])
    assert logs[0] == logs[2] == formatter.prompt_log("What is 2 + 3?")
    logs[0][1]["token_ids"].append(7)
    logs[0][1]["content"] = "changed"
    assert logs[2] == formatter.prompt_log("What is 2 + 3?")


def test_prompt_logs_started_in_the_background_equal_prompt_logs(chat_tokenizer):
    formatter = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief.")
    prompts = ["What is 2 + 3?", "", "What is 2 + 3?", "x"]
    finish = formatter.start_prompt_logs(prompts)
    assert finish() == formatter.prompt_logs(prompts)
    assert formatter.start_prompt_logs([])() == []


def test_an_encoding_error_is_raised_where_the_ids_are_asked_for(chat_tokenizer):
    finish = encode_in_background(chat_tokenizer, ["fine", None])  # no error yet
    with pytest.raises(TypeError):
        finish()


@pytest.mark.parametrize("ending", ["<|im_end|>", ""])
def test_extend_after_assistant_equals_chat_template(chat_tokenizer, ending):
    """With the generated stop token, or without it (a stop string ended the turn), the
    concatenated ids equal the template's rendering of the whole conversation."""
    formatter = ChatFormatter(chat_tokenizer)
    log = formatter.prompt_log("What is 2 + 3?")
    log.append(_assistant(chat_tokenizer, "2 + 3 = 6. \\boxed{6}" + ending))
    log = formatter.extend(log, [{"role": "user", "content": "Try again."}])
    assert [m["role"] for m in log] == ["user", "assistant", "user"]
    assert _ids(log) == _template_ids(chat_tokenizer, log)


def test_prompt_template_needs_placeholder(chat_tokenizer):
    with pytest.raises(SetupError, match=r'must contain one "\{\}"'):
        ChatFormatter(chat_tokenizer, "no placeholder")


@pytest.mark.parametrize("template", ["{} then \\boxed{}", "{} {answer}", "{} }"])
def test_prompt_template_with_bare_braces_is_refused(chat_tokenizer, template):
    with pytest.raises(SetupError, match="write literal braces twice"):
        ChatFormatter(chat_tokenizer, template)


def test_example_prompt_file_renders(chat_tokenizer):
    text = read_text_file(str(EXAMPLES / "prompts" / "math_boxed.txt"), "data.prompt_file")
    log = ChatFormatter(chat_tokenizer, text).prompt_log("What is 2 + 3?")
    assert log[0]["content"].startswith("What is 2 + 3?\n")
    assert log[0]["content"].endswith("within \\boxed{}.")


def test_read_text_file(tmp_path):
    path = tmp_path / "prompt.txt"
    path.write_text("Question: {}\n")
    assert read_text_file(str(path), "data.prompt_file") == "Question: {}"
    assert read_text_file(None, "data.prompt_file") is None
    with pytest.raises(SetupError, match="data.prompt_file: file not found"):
        read_text_file(str(tmp_path / "missing.txt"), "data.prompt_file")


def test_read_text_file_that_is_not_utf8(tmp_path):
    path = tmp_path / "system.txt"
    path.write_bytes("You are helpful.\nRéponds en français.\n".encode("latin-1"))
    with pytest.raises(SetupError) as raised:
        read_text_file(str(path), "data.system_prompt_file")
    assert str(raised.value) == (
        f"data.system_prompt_file: could not read {path}: line 2 is not UTF-8 text (byte 0xe9): "
        "save the file as UTF-8"
    )


class _SteppingClock:
    """A clock that moves `step` seconds each time it is read."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_long_rendering_and_tokenizing_tell_their_progress(chat_tokenizer, monkeypatch):
    """Each half of start_prompt_logs tells its progress (here every look at the clock is
    past the period: a line per PROGRESS_EVERY prompts rendered, per ENCODE_CHUNK distinct
    texts encoded), and the logs are prompt_logs' all the same."""
    from nemo_opd.data import chat
    from nemo_opd.data.progress import CountProgress

    monkeypatch.setattr(chat, "PROGRESS_EVERY", 2)
    monkeypatch.setattr(chat, "ENCODE_CHUNK", 3)
    formatter = ChatFormatter(chat_tokenizer, "Solve: {}", system_prompt="Be brief.")
    prompts = [f"What is {i} + 3?" for i in range(7)] + ["What is 0 + 3?"]
    lines = []
    rendering = CountProgress("rendering", 1.0, _SteppingClock(2.0), lines.append)
    tokenizing = CountProgress("tokenizing", 1.0, _SteppingClock(2.0), lines.append)
    finish = formatter.start_prompt_logs(prompts, None, rendering, tokenizing)
    assert finish() == formatter.prompt_logs(prompts)
    # rendered: 2, 4, 6 of 8 (the update at 0 starts the clock); encoded: 3, 6, 8 of the 8
    # distinct texts (7 user turns and the one system message)
    assert [line.split(" (")[0] for line in lines] == [
        "rendering: 2 of 8",
        "rendering: 4 of 8",
        "rendering: 6 of 8",
        "rendering: 8 in 8.0 s",
        "tokenizing: 3 of 8",
        "tokenizing: 6 of 8",
        "tokenizing: 8 of 8",
        "tokenizing: 8 in 8.0 s",
    ]
