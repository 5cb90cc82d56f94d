"""The real tokenizers the cross-tokenizer tests use (tests/real_tokenizers.py), built offline
from the packages that ship their vocabularies: each reads text as its family's own tokenizer
does (tiktoken for Qwen and Llama 3, mistral-common's Tekkenizer, sentencepiece), round-trips
it, and has the published special tokens and chat template."""

import random

import pytest
from real_tokenizers import HOSTILE_TEXTS, NAMES

from nemo_opd.data.chat import encode_texts

SIZES = {"qwen3": 151669, "llama3": 128256, "tekken": 131072, "mistral_sp": 32000}
EOS = {"qwen3": "<|im_end|>", "llama3": "<|eot_id|>", "tekken": "</s>", "mistral_sp": "</s>"}


def _random_texts(count: int, seed: int) -> list[str]:
    """Strings drawn from a mix of scripts, digits, punctuation and whitespace."""
    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyz ABCXYZ", "0123456789", " \n\t", ".,;:!?()[]{}<>|/\\'\"-_=+*",
        "éèàüöñçß", "\u0301\u0308", "数学答案是四十二", "αβγδ∑∫≈≠≤", "🎉👍🏽😀", "ひらがなカタカナ",
    ]  # fmt: skip
    return [
        "".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 80)))
        for _ in range(count)
    ]


@pytest.mark.parametrize("name", NAMES)
def test_matches_the_reference_tokenizer(name, real_tokenizer, real_reference):
    """Token ids equal the family's own tokenizer's on hostile and random text."""
    tokenizer, reference = real_tokenizer(name), real_reference(name)
    assert len(tokenizer) == SIZES[name]
    for text in (*HOSTILE_TEXTS, *_random_texts(300, seed=len(name))):
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        assert ids == reference(text), text


@pytest.mark.parametrize("name", NAMES)
def test_round_trips(name, real_tokenizer):
    """decode(encode(text)) is the text (NFC-normalized for Qwen, whose tokenizer normalizes)."""
    import unicodedata

    tokenizer = real_tokenizer(name)
    for text in (*HOSTILE_TEXTS, *_random_texts(100, seed=7)):
        ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        decoded = tokenizer.decode(ids, skip_special_tokens=False)
        expected = unicodedata.normalize("NFC", text) if name == "qwen3" else text
        assert decoded == expected, text


@pytest.mark.parametrize("name", NAMES)
def test_special_tokens_and_template(name, real_tokenizer):
    tokenizer = real_tokenizer(name)
    assert tokenizer.eos_token == EOS[name]
    assert tokenizer.convert_ids_to_tokens(tokenizer.eos_token_id) == EOS[name]
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    assert "What is 2 + 2?" in text and "And 3 + 3?" in text


def test_llama3_template_matches_llama_models_chat_format(real_tokenizer):
    """Llama 3's template, tokenized, is llama-models' own dialog encoding."""
    from llama_models.datatypes import RawMessage
    from llama_models.llama3.chat_format import ChatFormat
    from llama_models.llama3.tokenizer import Tokenizer

    tokenizer = real_tokenizer("llama3")
    conversation = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    text = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True)
    ours = tokenizer.encode(text, add_special_tokens=False)
    dialog = [RawMessage(role=m["role"], content=m["content"]) for m in conversation]
    theirs = ChatFormat(Tokenizer.get_instance()).encode_dialog_prompt(dialog).tokens
    assert ours == theirs


def test_tekken_template_matches_mistral_common(real_tokenizer):
    """Mistral Nemo's template, tokenized, is mistral-common's own chat encoding."""
    from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
    from mistral_common.protocol.instruct.request import ChatCompletionRequest
    from real_tokenizers import mistral_tekken

    tokenizer = real_tokenizer("tekken")
    conversation = [
        {"role": "user", "content": "What is 2 + 2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3 + 3?"},
    ]
    ours = tokenizer.encode(
        tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False
    )
    messages = [
        UserMessage(content="What is 2 + 2?"),
        AssistantMessage(content="4"),
        UserMessage(content="And 3 + 3?"),
    ]
    request = ChatCompletionRequest(messages=messages)
    theirs = mistral_tekken().encode_chat_completion(request).tokens
    assert ours == theirs


def test_qwen3_template_writes_the_thinking_block(real_tokenizer):
    """Qwen3's template: the last assistant turn after the last query gets a think block, and
    enable_thinking=False writes an empty one into the generation prompt."""
    tokenizer = real_tokenizer("qwen3")
    user = [{"role": "user", "content": "Hi"}]
    done = tokenizer.apply_chat_template(
        [*user, {"role": "assistant", "content": "4"}], tokenize=False
    )
    assert done.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n4<|im_end|>\n")
    prompt = tokenizer.apply_chat_template(
        user, tokenize=False, add_generation_prompt=True, enable_thinking=False
    )
    assert prompt.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.parametrize("name", NAMES)
def test_prompt_encoding_equals_transformers(name, real_tokenizer):
    """encode_texts (how the chat formatter tokenizes a dataset's prompts: the fast backend's
    batch) gives transformers' ids, special-token strings read as the special tokens, also
    after a call that split them (transformers leaves the backend's flag set); with
    truncation set on the backend (as a tokenizer.json can ship it) nothing is cut either."""
    tokenizer = real_tokenizer(name)  # the session's: its truncation is put back below
    texts = [*HOSTILE_TEXTS, *_random_texts(200, seed=3)]
    expected = tokenizer(texts, add_special_tokens=False)["input_ids"]
    assert encode_texts(tokenizer, texts) == expected
    split = tokenizer(texts, add_special_tokens=False, split_special_tokens=True)["input_ids"]
    assert split != expected  # the texts hold special-token strings
    assert encode_texts(tokenizer, texts) == expected
    backend = tokenizer.backend_tokenizer
    truncation = backend.truncation
    backend.enable_truncation(4)
    try:
        assert encode_texts(tokenizer, texts) == expected
    finally:
        if truncation is None:
            backend.no_truncation()
        else:
            backend.enable_truncation(**truncation)
