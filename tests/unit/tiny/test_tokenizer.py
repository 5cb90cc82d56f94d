import pytest
from transformers import AutoTokenizer

from nemo_opd.tiny.sft import encode_sft_examples
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import IM_END, IM_START, PAD_TOKEN, build_tiny_tokenizer

RECORDS = build_tiny_math_splits(TinyMathConfig(num_train=2000, num_validation=50, seed=3))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    tokenizer = build_tiny_tokenizer(
        RECORDS["train"], vocab_size=512, min_frequency=2, model_max_length=128
    )
    path = tmp_path_factory.mktemp("tokenizer")
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    return AutoTokenizer.from_pretrained(tokenizer_dir)


def conversation(record: dict) -> list[dict]:
    return [
        {"role": "user", "content": record["prompt"]},
        {"role": "assistant", "content": record["solution"]},
    ]


def test_small_vocab_with_special_tokens(tokenizer):
    assert 256 < len(tokenizer) <= 512
    assert tokenizer.eos_token == IM_END
    assert tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.convert_tokens_to_ids(IM_START) not in (None, tokenizer.unk_token_id)
    assert tokenizer.bos_token is None


def test_no_token_holds_more_than_one_digit_or_a_digit_and_more(tokenizer):
    for token_id in range(len(tokenizer)):
        text = tokenizer.decode([token_id])
        if any(ch.isdigit() for ch in text):
            assert len(text) == 1, repr(text)


def test_numbers_are_split_into_digits(tokenizer):
    ids = tokenizer("7 * 12 = 84. \\boxed{84}", add_special_tokens=False)["input_ids"]
    pieces = [tokenizer.decode([i]) for i in ids]
    assert [p for p in pieces if p.isdigit()] == ["7", "1", "2", "8", "4", "8", "4"]
    assert len(ids) <= 12  # words and operators merged: short sequences


@pytest.mark.parametrize(
    "text",
    ["What is 905 + 17?", "  two  spaces\n\nnew lines\t tab", "héllo wörld ✓ 12,345.6", ""],
)
def test_round_trip(tokenizer, text):
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_round_trip_on_task_records(tokenizer):
    for record in RECORDS["validation"]:
        for text in (record["prompt"], record["solution"]):
            assert tokenizer.decode(tokenizer(text)["input_ids"]) == text


def test_generation_prompt(tokenizer):
    text = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 1 + 2?"}], tokenize=False, add_generation_prompt=True
    )
    assert text == "<|im_start|>user\nWhat is 1 + 2?<|im_end|>\n<|im_start|>assistant\n"


def test_assistant_mask_covers_solution_and_eos_only(tokenizer):
    record = RECORDS["validation"][0]
    out = tokenizer.apply_chat_template(
        conversation(record), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked = [i for i, m in zip(ids, mask, strict=True) if m]
    assert tokenizer.decode(masked) == record["solution"] + IM_END
    assert masked[-1] == tokenizer.eos_token_id
    first = mask.index(1)
    assert tokenizer.decode(ids[:first]).endswith("<|im_start|>assistant\n")
    assert mask[first:] == [1] * (len(masked)) + [0]  # one contiguous span, then the newline


def test_sft_encoding_matches_chat_template(tokenizer):
    records = RECORDS["validation"]
    for record, example in zip(records, encode_sft_examples(records, tokenizer), strict=True):
        out = tokenizer.apply_chat_template(
            conversation(record), tokenize=True, return_dict=True, return_assistant_tokens_mask=True
        )
        # The template ends the turn with "\n" after <|im_end|>; training stops at <|im_end|>.
        assert example.input_ids == out["input_ids"][:-1]
        assert example.prompt_len == out["assistant_masks"].index(1)
