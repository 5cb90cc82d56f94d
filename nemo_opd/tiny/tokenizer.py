"""A small byte-level BPE tokenizer trained locally, with a Qwen-style chat format.

Pre-tokenization cuts text into single digits, words (with their leading space, and with the
space before a following number) and whitespace runs, so no merge can ever contain a digit:
``"138 - 7 = 131"`` is ``["1", "3", "8", "Ġ-Ġ", "7", "Ġ=Ġ", "1", "3", "1"]``. Arithmetic on
digit tokens is far easier for a tiny model than on multi-digit chunks, and attaching the space
before a number to the word in front of it saves one token per number. The 256 byte tokens are
always in the vocabulary, so any text can be encoded.

Chat format (Qwen style, no default system prompt)::

    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n{answer}<|im_end|>\\n

The assistant content and its closing ``<|im_end|>`` sit inside ``{% generation %}`` so that
``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks exactly the tokens a model
must learn to produce. ``<|im_end|>`` is the eos token and ``<|endoftext|>`` the pad token.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, IM_END)

# One digit | a word with an optional leading space, plus the space before a number | whitespace.
PIECE_PATTERN = r"\d| ?[^\s\d]+(?: (?=\d))?|\s+"

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


PLAIN_CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '### assistant:\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\n' }}"
    "{%- else %}"
    "{{- '### ' + message['role'] + ':\n' + message['content'] + '\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '### assistant:\n' }}{%- endif %}"
)

# ChatML with tools, as Qwen3 writes them: the tools offered (`tools=`, by name only: a tiny
# model's context is short) in a system turn; tool results in a user turn, each between
# <tool_response> tags, consecutive results in one turn.
TOOLS_CHAT_TEMPLATE = (
    "{%- if tools %}"
    "{{- '<|im_start|>system\ntools: ' }}"
    "{%- for tool in tools %}"
    "{{- (', ' if not loop.first else '') + tool['function']['name'] }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message['role'] == 'assistant' %}"
    "{{- '<|im_start|>assistant\n' }}"
    "{%- generation %}{{- message['content'] + '<|im_end|>' }}{%- endgeneration %}"
    "{{- '\n' }}"
    "{%- elif message['role'] == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{- '<|im_start|>user' }}"
    "{%- endif %}"
    "{{- '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{- '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- else %}"
    "{{- '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"
)
TOOL_TAGS = ("<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>")
"""Tokens of their own in the "tools" style (not special: decoding keeps them, as Qwen3's)."""

CHAT_TEMPLATES = {None: CHAT_TEMPLATE, "plain": PLAIN_CHAT_TEMPLATE, "tools": TOOLS_CHAT_TEMPLATE}
"""TokenizerRecipe.chat_style -> the chat template. All end an assistant turn with <|im_end|>
(the eos token)."""


def chat_corpus(records: Iterable[dict]) -> Iterator[str]:
    """Texts to train the tokenizer on: role names and message contents (specials excluded)."""
    for record in records:
        yield "user\n" + record["prompt"]
        yield "assistant\n" + record["solution"]


def build_bpe(texts: Iterable[str], vocab_size: int, min_frequency: int) -> Tokenizer:
    """Train a byte-level BPE whose merges never contain a digit.

    Training stops at ``vocab_size`` tokens or earlier, when no pair occurs ``min_frequency``
    times.
    """
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PIECE_PATTERN), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def wrap_tokenizer(
    tokenizer: Tokenizer, model_max_length: int, chat_style: str | None = None
) -> PreTrainedTokenizerFast:
    """The transformers tokenizer: special tokens, chat template, right padding by default;
    the "tools" style adds TOOL_TAGS as tokens."""
    if chat_style == "tools":
        tokenizer.add_tokens(
            [AddedToken(tag, special=False, normalized=False) for tag in TOOL_TAGS]
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        additional_special_tokens=[IM_START],
        chat_template=CHAT_TEMPLATES[chat_style],
        model_max_length=model_max_length,
        padding_side="right",
        clean_up_tokenization_spaces=False,
    )


def build_tiny_tokenizer(
    records: Iterable[dict],
    vocab_size: int,
    min_frequency: int,
    model_max_length: int,
    chat_style: str | None = None,
    extra_texts: Iterable[str] = (),
) -> PreTrainedTokenizerFast:
    """Train the tokenizer on task records (``prompt`` and ``solution`` fields) and
    ``extra_texts`` (the tool task's calls and tools line, tags left out)."""
    corpus = itertools.chain(chat_corpus(records), extra_texts)
    bpe = build_bpe(corpus, vocab_size, min_frequency)
    return wrap_tokenizer(bpe, model_max_length, chat_style)
