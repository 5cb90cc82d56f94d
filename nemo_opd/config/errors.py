"""ConfigError, the one exception the configuration system raises, and message helpers."""

import difflib
from collections.abc import Iterable


class ConfigError(ValueError):
    """A configuration problem, described in one human message that names the key path."""


def closest(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to `name` (difflib ratio >= 0.6), or None; None at once for
    a name longer than any key (difflib's cost grows with the product of the lengths)."""
    if len(name) > 256:
        return None
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=1, cutoff=0.6)
    return matches[0] if matches else None


def suggest(name: str, candidates: Iterable[str]) -> str:
    """Return "; did you mean 'x'?" for the closest candidate to `name`, or "" if none is close."""
    match = closest(name, candidates)
    return f"; did you mean '{match}'?" if match else ""


def show(value: object, limit: int = 80) -> str:
    """Render a config value the way a user would write it in YAML, shortened to `limit` chars
    (a long string is cut before it is rendered, so a megabyte value costs no more than a short
    one)."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, int) and value.bit_length() > 64:
        text = f"an integer of {value.bit_length()} bits"  # repr() refuses over 4,300 digits
    elif isinstance(value, str) and len(value) > limit:
        text = repr(value[:limit])
    else:
        text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def show_path(path: str, limit: int = 200) -> str:
    """A key path for a message, shortened to `limit` characters (a key can be a megabyte)."""
    return path if len(path) <= limit else path[: limit - 3] + "..."


def join_path(parts: Iterable[str | int]) -> str:
    """Join key-path parts into `a.b[0].c` form."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else str(part)
    return text
