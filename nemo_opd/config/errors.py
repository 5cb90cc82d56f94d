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
    """The hint "; did you mean 'x'?" for the closest_key x to `name`, or "" if there is none."""
    match = closest_key(name, candidates)
    return f"; did you mean '{match}'?" if match else ""


def closest_key(name: str, candidates: Iterable[str]) -> str | None:
    """The candidate most similar to `name` whose words (split at '_') each spell a word of
    `name` closely, or None. A key of other words is another meaning, however many letters
    it shares: generation_batch_size is not a misspelling of train_micro_batch_size, nor
    logprob_chunk_size of logprob_batch_size."""
    if len(name) > 256:
        return None
    matches = difflib.get_close_matches(name, sorted(set(candidates)), n=5, cutoff=0.6)
    return next((match for match in matches if _same_words(name, match)), None)


def _same_words(name: str, key: str) -> bool:
    """Whether every word of `name` is a word of `key` or a misspelling of one (a prefix of it,
    or difflib ratio >= 0.75): `kl_typ` and `kl_type`, `loss` and `loss_fn`."""
    words = [word for word in key.lower().split("_") if word]
    return all(
        any(_same_word(part, word) for word in words) for part in name.lower().split("_") if part
    )


def _same_word(part: str, word: str) -> bool:
    if word.startswith(part) or part.startswith(word):
        return len(min(part, word, key=len)) >= min(3, len(word))
    return difflib.SequenceMatcher(None, part, word).ratio() >= 0.75


def show(value: object, limit: int = 80) -> str:
    """A config value as a user would write it in YAML, shortened to `limit` chars (a long
    string is cut before it is rendered: a megabyte value costs no more than a short one)."""
    if value is None or isinstance(value, bool):
        text = {None: "null", True: "true", False: "false"}[value]
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
        text += f"[{part}]" if isinstance(part, int) else f".{part}" if text else str(part)
    return text
