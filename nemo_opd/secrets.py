"""Secrets never leave the process: what a run prints, logs or sends to a tracker is redacted.

Two kinds of secret:
- the user-info of a URL, `scheme://user:password@host/...`, in any value or message: it becomes
  `scheme://***@host/...`, up to the last @ before the path (httpx sends
  `http://alice:p@ss@host/` as the password `p@ss`); a value that failed a URL's validation is
  echoed without anything before its last @, scheme or not (redact_user_info);
- a secret read at run time, such as a served teacher's API key from the environment variable
  teacher.server.api_key_env names (the key itself is never in the config): once registered,
  its text is replaced by `***` wherever it appears.

Applied where text leaves the process: `--print-config`, every error message the command line
prints, the logger's run_config.json, its TensorBoard text and its W&B config and run name, and
the served teacher's messages. What W&B would record of the process on its own (the command
line, whose overrides can hold a secret) it is told not to (nemo_opd.utils.logger's
WANDB_SETTINGS). Environment variables never enter a config at all (no `${oc.env:...}`, however
spelled: nemo_opd.config.interpolation).
"""

import re
from typing import Any

REDACTED = "***"

# The user-info of a URL runs from the scheme to the last @ before the path: httpx sends
# http://alice:p@ss@host/ as the password p@ss. A ? or # in it is taken in too (httpx refuses
# such a URL, but its text is still a password); whitespace ends it, as it ends a URL in text.
# A path library folds the // after the scheme into one / (Path("http://a:b@h") reads
# "http:/a:b@h"): that form is a URL's user-info too.
_USERINFO = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.\-]*:/{1,2})[^\s/]*@")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
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


def redact_user_info(value: str) -> str:
    """`value`, a string that may be a URL, as an error message may echo it: everything from
    after its scheme (if any) to its last @ replaced by ***. Made for a value that failed a
    URL's validation, so it takes in more than redact_text: `alice:s3cr3t@host/v1` has no
    scheme, and in `http://alice:pa/ss@host/v1` the password runs past a /."""
    scheme = _SCHEME.match(value)
    start = scheme.end() if scheme else 0
    at = value.rfind("@", start)
    return value if at < 0 else f"{value[:start]}{REDACTED}{value[at:]}"


def redact(data: Any) -> Any:
    """A copy of plain data (dicts, lists, scalars) with every string redacted (redact_text)."""
    if isinstance(data, dict):
        return {key: redact(value) for key, value in data.items()}
    if isinstance(data, list | tuple):
        return [redact(value) for value in data]
    return redact_text(data) if isinstance(data, str) else data
