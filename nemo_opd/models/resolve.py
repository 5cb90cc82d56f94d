"""Map model names to loadable locations: ``tiny:*`` names to the locally built tiny assets."""

from __future__ import annotations

TINY_PREFIX = "tiny:"
TINY_NAMES = ("teacher", "student", "tokenizer")


def resolve_pretrained(name_or_path: str) -> str:
    """A directory or hub name that ``from_pretrained`` (or vLLM) can load.

    ``"tiny:teacher"``, ``"tiny:student"`` and ``"tiny:tokenizer"`` become directories of the
    default tiny assets, built on first use (a few minutes on a laptop CPU) and cached. Any other
    string (a hub name, a local path) is returned unchanged.
    """
    if not name_or_path.startswith(TINY_PREFIX):
        return name_or_path
    name = name_or_path[len(TINY_PREFIX) :]
    if name not in TINY_NAMES:
        expected = ", ".join(TINY_PREFIX + n for n in TINY_NAMES)
        raise ValueError(f"unknown tiny asset {name_or_path!r}; expected one of {expected}")
    # Imported here: building pulls in torch and transformers, resolving other names does not.
    from nemo_opd.models.tiny_assets import ensure_tiny_assets

    return str(getattr(ensure_tiny_assets(), name))
