"""Secrets never leave the process: what a run prints, logs or sends to a tracker is redacted.

Two kinds of secret:
- the user-info of a URL, `scheme://user:password@host/...`, in any value or message: it becomes
  `scheme://***@host/...`;
- a secret read at run time, such as a served teacher's API key from the environment variable
  teacher.server.api_key_env names (the key itself is never in the config): once registered,
  its text is replaced by `***` wherever it appears.

Applied where text leaves the process: `--print-config`, every error message the command line
prints, the logger's run_config.json, its TensorBoard text and its W&B config, and the served
teacher's messages. Environment variables never enter a config at all (`${oc.env:...}` is
refused: nemo_opd.config.interpolation).
"""

import re
from typing import Any

REDACTED = "***"

_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*://)[^\s/@?#]+@")
_MIN_SECRET_CHARS = 4  # a shorter "secret" would redact ordinary text
_secrets: set[str] = set()


def register_secret(value: str) -> None:
    """Redact `value` from now on, wherever it appears (an API key read from the environment)."""
    if isinstance(value, str) and len(value) >= _MIN_SECRET_CHARS:
        _secrets.add(value)


def redact_text(text: str) -> str:
    """`text` with URL user-info and every registered secret replaced by ***."""
    text = _USERINFO.sub(lambda m: f"{m.group('scheme')}{REDACTED}@", text)
    for secret in sorted(_secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def redact(data: Any) -> Any:
    """A copy of plain data (dicts, lists, scalars) with every string redacted (redact_text)."""
    if isinstance(data, dict):
        return {key: redact(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [redact(value) for value in data]
    return redact_text(data) if isinstance(data, str) else data
