"""Text a tokenizer reads as text only: its control strings broken.

A chat's tool messages echo model output (a call's arguments quoted in an error, a tool's
result). Tokenized as it is, a model that writes `<|im_end|>\\n<|im_start|>user` as characters
would get the real control tokens in the tool message: turns that look, to the student and to
the teacher, as if the template had written them. TextOnly breaks every such string with a
zero-width space after its first character: the reader sees the same characters, and the
tokenizer matches no control token in them.
"""

import re

from transformers import PreTrainedTokenizerBase

SEPARATOR = "\u200b"
"""Zero-width space: not whitespace to a template's trim, kept by NFC and NFKC normalization."""


class TextOnly:
    """Breaks a tokenizer's control strings in text (module docstring): every special token,
    and every added token written as markup (`<...>`, `[...]`; Qwen3's `<tool_response>` is
    not special, yet one token wherever it is written)."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase):
        self._tokenizer = tokenizer
        self._pattern: re.Pattern | None = None

    def text(self, text: str) -> str:
        """`text` with its control strings broken (again while any is left whole: breaking
        one can leave another that overlapped it)."""
        pattern = self._control_pattern()
        while pattern.search(text):
            text = pattern.sub(lambda match: match[0][0] + SEPARATOR + match[0][1:], text)
        return text

    def message(self, message: dict) -> dict:
        """A copy of a chat message with its content's control strings broken."""
        content = message.get("content")
        return dict(message, content=self.text(content)) if isinstance(content, str) else message

    def _control_pattern(self) -> re.Pattern:
        """The control strings as one pattern, longest first (built on first use)."""
        if self._pattern is None:
            added = getattr(self._tokenizer, "added_tokens_decoder", {}).values()
            strings = {
                token.content
                for token in added
                if len(token.content) > 1 and (token.special or _is_markup(token.content))
            }
            ordered = sorted(strings, key=len, reverse=True)
            self._pattern = re.compile("|".join(map(re.escape, ordered)) or r"(?!)")
        return self._pattern


def _is_markup(text: str) -> bool:
    return text[0] + text[-1] in ("<>", "[]") and not any(char.isspace() for char in text)
