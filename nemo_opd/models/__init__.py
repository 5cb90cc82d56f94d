"""Models: the tiny tokenizer and Qwen3 models of the embedded default, and name resolution.

``resolve_pretrained("tiny:teacher")`` returns the directory of the locally built tiny teacher
(building it on first use); any other name or path is returned unchanged.
"""

from nemo_opd.models.resolve import TINY_NAMES, TINY_PREFIX, resolve_pretrained

__all__ = ["TINY_NAMES", "TINY_PREFIX", "resolve_pretrained"]
