"""Real tokenizers for the tests, built offline from the packages that ship their vocabularies.

No model hub is reachable from the tests, but the vocabularies of the families a user brings
ship inside packages on the index (the dev group installs them):

- Qwen3: Qwen's BPE ranks (151,643 tokens, shared by Qwen2, 2.5 and 3) in dashscope's
  `resources/qwen.tiktoken`, its pre-tokenizer rule in `dashscope/tokenizers/qwen_tokenizer.py`
  (one digit per token), NFC normalization as in Qwen's tokenizer.json, and Qwen3's special
  tokens from id 151,643 (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, ..., `<think>`,
  `</think>`); eos `<|im_end|>` as in the instruct models' configs, pad `<|endoftext|>`.
- Llama 3: llama-models' `llama3/tokenizer.model` (128,000 ranks, 256 special tokens after them,
  up to three digits per token); bos `<|begin_of_text|>` added in front, eos `<|eot_id|>`.
- Tekken (Mistral Nemo and later): mistral-common's `tekken_240911.json` (1,000 control tokens,
  then the first 130,072 BPE ranks: 131,072 ids), eos `</s>`, unk `<unk>`.
- Mistral's SentencePiece model (v1, 32,000 pieces, byte fallback): mistral-common's
  `tokenizer.model.v1`; merges ordered by piece score and words cut as sentencepiece
  cuts them (where the published tokenizer.json files differ from sentencepiece on
  runs of spaces, this one follows sentencepiece).

Each is a Hugging Face fast tokenizer (transformers' TikTokenConverter for the tiktoken ranks)
with its family's chat template, built once and cached as save_pretrained files under
`cache_dir()` (NEMO_OPD_TEST_CACHE, else ~/.cache/nemo_opd/real_tokenizers), so later sessions
load them in a second. `reference(name)` is the family's own tokenizer (tiktoken, mistral-common's
Tekkenizer, sentencepiece) as `text -> ids`, for the checks that the built ones agree with it.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import re
import unicodedata
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    normalizers,
    pre_tokenizers,
    processors,
)
from tokenizers.models import BPE
from transformers import PreTrainedTokenizerFast
from transformers.convert_slow_tokenizer import TikTokenConverter

NAMES = ("qwen3", "llama3", "tekken", "mistral_sp")

QWEN_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# ids from 151,643 on, in order; the last six are not special (plain added tokens)
QWEN3_SPECIALS = str.split(
    "<|endoftext|> <|im_start|> <|im_end|> <|object_ref_start|> <|object_ref_end|> "
    "<|box_start|> <|box_end|> <|quad_start|> <|quad_end|> <|vision_start|> <|vision_end|> "
    "<|vision_pad|> <|image_pad|> <|video_pad|> <tool_call> </tool_call> <|fim_prefix|> "
    "<|fim_middle|> <|fim_suffix|> <|fim_pad|> <|repo_name|> <|file_sep|> <tool_response> "
    "</tool_response> <think> </think>"
)
QWEN3_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                     "<think>", "</think>"}  # fmt: skip

# Qwen3's chat template (tools left out): the reasoning of the last assistant turn after the
# last user query inside <think>...</think>; enable_thinking=false writes an empty block into
# the generation prompt.
QWEN3_TEMPLATE = """\
{%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and \
not(message.content.startswith('<tool_response>') and \
message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\\n')\
.split('<think>')[-1].lstrip('\\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\\n<think>\\n' \
+ reasoning_content.strip('\\n') + '\\n</think>\\n\\n' + content.lstrip('\\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' + content + '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}
"""

# Meta-Llama-3-Instruct's chat template: every message's content trimmed.
LLAMA3_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}"
    "{% endif %}"
)

# Mistral Nemo's (Tekken) chat template, tools left out: roles must alternate after an
# optional system message, which goes into the last user message.
TEKKEN_TEMPLATE = """\
{%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must \
alternate user/assistant/user/assistant/...") }}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\\n\\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported!") }}
    {%- endif %}
{%- endfor %}
"""

# Mistral-7B-Instruct v0.1/v0.2's chat template: no system message at all.
MISTRAL_SP_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ message['content'] + eos_token}}"
    "{% else %}{{ raise_exception('Only user and assistant roles are supported!') }}"
    "{% endif %}{% endfor %}"
)


def cache_dir() -> Path:
    """Where built tokenizers are kept between test sessions."""
    root = os.environ.get("NEMO_OPD_TEST_CACHE")
    base = Path(root) if root else Path.home() / ".cache" / "nemo_opd"
    return base / "real_tokenizers"


def load(name: str) -> PreTrainedTokenizerFast:
    """The real tokenizer `name` (one of NAMES), built on first use and cached."""
    folder = cache_dir() / f"{name}-{_source_version(name)}-v5"
    if not (folder / "tokenizer.json").is_file():
        tokenizer = _BUILDERS[name]()
        partial = folder.with_name(folder.name + f".tmp{os.getpid()}")
        tokenizer.save_pretrained(partial)
        partial.replace(folder) if not folder.exists() else None
    return PreTrainedTokenizerFast.from_pretrained(folder)


def reference(name: str) -> Callable[[str], list[int]]:
    """The family's own tokenizer: text -> ids without special tokens, control strings in the
    text read as text."""
    if name == "qwen3":
        return _qwen_reference()
    if name == "llama3":
        from llama_models.llama3.tokenizer import Tokenizer as Llama3

        model = Llama3.get_instance().model
        return lambda text: model.encode_ordinary(text)
    if name == "tekken":
        tekken = mistral_tekken().instruct_tokenizer.tokenizer
        return lambda text: tekken.encode(text, bos=False, eos=False)
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(_mistral_file("v1")))
    return lambda text: processor.encode(text)


def _qwen_reference() -> Callable[[str], list[int]]:
    """tiktoken with Qwen's ranks and rule, after NFC; Qwen3's plain added tokens (`<think>`,
    ...) are tokens wherever they appear, as in its tokenizer.json."""
    encoding = _tiktoken("Qwen", _qwen_file(), QWEN_PATTERN, 151643)
    added = {text: 151643 + i for i, text in enumerate(QWEN3_SPECIALS) if text in QWEN3_NOT_SPECIAL}
    splitter = re.compile("(" + "|".join(re.escape(text) for text in added) + ")")

    def encode(text: str) -> list[int]:
        ids = []
        for piece in splitter.split(unicodedata.normalize("NFC", text)):
            ids.extend([added[piece]] if piece in added else encoding.encode_ordinary(piece))
        return ids

    return encode


def _source_version(name: str) -> str:
    package = {"qwen3": "dashscope", "llama3": "llama-models"}.get(name, "mistral-common")
    return importlib.metadata.version(package)


def _qwen_file() -> Path:
    return Path(str(resources.files("dashscope") / "resources" / "qwen.tiktoken"))


def _mistral_file(name: str) -> Path:
    data = resources.files("mistral_common") / "data"
    files = {"tekken": "tekken_240911.json", "v1": "tokenizer.model.v1"}
    return Path(str(data / files[name]))


def _tiktoken(name: str, path: Path, pattern: str, first_special: int):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(str(path))
    return tiktoken.Encoding(name, pat_str=pattern, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": first_special})  # fmt: skip


@functools.cache
def mistral_tekken():
    """mistral-common's own MistralTokenizer for Tekken (chat encoding; its Tekkenizer is the
    reference's), loaded once per process: its vocabulary takes seconds to read."""
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    return MistralTokenizer.from_file(str(_mistral_file("tekken")))


def _tekkenizer():
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    return Tekkenizer.from_file(str(_mistral_file("tekken")))


def _byte_level_bpe(ranks_file: Path, pattern: str, offset: int = 0) -> tuple[dict, list]:
    """(vocab, merges) of tiktoken ranks in GPT-2's byte alphabet, ids shifted by `offset`."""
    vocab, merges = TikTokenConverter(str(ranks_file), pattern=pattern)\
        .extract_vocab_merges_from_model(str(ranks_file))  # fmt: skip
    return {piece: rank + offset for piece, rank in vocab.items()}, merges


def _byte_level_pipeline(tokenizer: Tokenizer, pattern: str) -> None:
    """The pre-tokenizer and decoder of the published byte-level tokenizer.json files."""
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])  # fmt: skip
    tokenizer.decoder = decoders.ByteLevel()


def _build_qwen3() -> PreTrainedTokenizerFast:
    vocab, merges = _byte_level_bpe(_qwen_file(), QWEN_PATTERN)
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    tokenizer.normalizer = normalizers.NFC()
    _byte_level_pipeline(tokenizer, QWEN_PATTERN)
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_tokens([
        AddedToken(text, special=text not in QWEN3_NOT_SPECIAL, normalized=False)
        for text in QWEN3_SPECIALS
    ])  # fmt: skip
    assert tokenizer.token_to_id("</think>") == 151668
    return _wrap(tokenizer, QWEN3_TEMPLATE, eos_token="<|im_end|>", pad_token="<|endoftext|>")


def _build_llama3() -> PreTrainedTokenizerFast:
    from llama_models.llama3.tokenizer import Tokenizer as Llama3

    pattern = Llama3.pat_str
    path = Path(str(resources.files("llama_models") / "llama3" / "tokenizer.model"))
    vocab, merges = _byte_level_bpe(path, pattern)
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    _byte_level_pipeline(tokenizer, pattern)
    specials = sorted(Llama3.get_instance().special_tokens.items(), key=lambda item: item[1])
    tokenizer.add_special_tokens([AddedToken(text, normalized=False) for text, _ in specials])
    assert tokenizer.token_to_id("<|eot_id|>") == 128009
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                      special_tokens=[("<|begin_of_text|>", 128000)]),
    ])  # fmt: skip
    return _wrap(tokenizer, LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|eot_id|>")


def _build_tekken() -> PreTrainedTokenizerFast:
    settings = json.loads(_mistral_file("tekken").read_text())
    config = settings["config"]
    specials = config["default_num_special_tokens"]
    kept = settings["vocab"][: config["default_vocab_size"] - specials]
    ranks = cache_dir() / "tekken_ranks.tiktoken"  # TikTokenConverter reads a ranks file
    ranks.parent.mkdir(parents=True, exist_ok=True)
    ranks.write_text("".join(f"{e['token_bytes']} {e['rank']}\n" for e in kept))
    vocab, merges = _byte_level_bpe(ranks, config["pattern"], offset=specials)
    tekken = _tekkenizer()
    controls = [tekken.id_to_piece(i) for i in range(specials)]
    assert not set(controls) & set(vocab)
    vocab.update({text: index for index, text in enumerate(controls)})
    tokenizer = Tokenizer(BPE(vocab, merges, fuse_unk=False, ignore_merges=True))
    _byte_level_pipeline(tokenizer, config["pattern"])
    tokenizer.add_special_tokens([AddedToken(text, normalized=False) for text in controls])
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    return _wrap(tokenizer, TEKKEN_TEMPLATE, bos_token="<s>", eos_token="</s>",
                 unk_token="<unk>", pad_token="<pad>")  # fmt: skip


def _build_mistral_sp() -> PreTrainedTokenizerFast:
    from transformers.tokenization_utils_sentencepiece import SentencePieceExtractor

    vocab, scores, merges = SentencePieceExtractor(str(_mistral_file("v1"))).extract(
        vocab_scores=True
    )
    model = BPE(vocab, merges, unk_token="<unk>", fuse_unk=True, byte_fallback=True)
    tokenizer = Tokenizer(model)
    # sentencepiece always prepends "▁" (add_dummy_prefix), even before a space, and cuts
    # the text into words that each start with a run of spaces (allow_whitespace_only_pieces):
    # Metaspace alone does neither.
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("▁+[^▁]*"), behavior="isolated")
    tokenizer.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
        decoders.Strip(" ", 1, 0),
    ])  # fmt: skip
    tokenizer.add_special_tokens([AddedToken(t, normalized=False) for t in vocab if t in
                                  ("<unk>", "<s>", "</s>")])  # fmt: skip
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", 1)]
    )
    return _wrap(tokenizer, MISTRAL_SP_TEMPLATE, bos_token="<s>", eos_token="</s>",
                 unk_token="<unk>", pad_token="</s>")  # fmt: skip


def _wrap(tokenizer: Tokenizer, template: str, **special: str) -> PreTrainedTokenizerFast:
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, **special)
    wrapped.chat_template = template
    return wrapped


_BUILDERS = {
    "qwen3": _build_qwen3,
    "llama3": _build_llama3,
    "tekken": _build_tekken,
    "mistral_sp": _build_mistral_sp,
}


HOSTILE_TEXTS = (
    "Let $f(x) = \\frac{x^2 + 1}{\\sqrt{x}}$; then \\(\\int_0^1 f\\,dx\\) and "
    "\\boxed{\\tfrac{4}{3}}.",
    "∀ε>0 ∃δ: |x−a|<δ ⇒ |f(x)−f(a)|<ε, so a ≈ b ≠ c ≤ d ∑ᵢ xᵢ² ∈ ℝ.",
    "数学的答案是四十二。日本語のテキスト、한국어 텍스트도 있습니다。",
    "Great job!🎉🎉 👩🏽‍💻 works; flags 🇫🇷🇯🇵 and keycaps 1️⃣ too!!!",
    "Composed café naïve résumé, decomposed cafe\u0301 nai\u0308ve re\u0301sume\u0301.",
    "  leading spaces,\ttabs\t\tand\n\n\nnewlines   \n  trailing   ",
    "def f(x):\n    return {'a': [1, 2, 3]}  # comment\n\nprint(f(0)) != None\n",
    "12345678901234567890 + 0.000123 = 3.14159e-10; 1,000,000 and 2024-11-26 at 10:45.",
    "<think>\nFirst, 7 * 6 = 42.\nCheck: 42 / 6 = 7.\n</think>\n\nThe answer is \\boxed{42}.",
    "End-of-turn strings as text: <|im_end|> <|eot_id|> </s> <|endoftext|> [INST] <unk> <s>.",
)
"""Text that byte-level BPE, NFC and chat templates each treat in their own way."""
