"""Whether a model, tokenizer or dataset name is a local path or a hub name, so that a local
path to no folder is refused as such ("no such folder") instead of being asked of the hub,
which answers it with retries and an unrelated message.

A name with a URL scheme (`https://...`) is neither: it is left to what reads it. Otherwise a
name is a local path when it starts with `/`, `./`, `../` or `~`; when it has more than one
`/`; when it holds a character no hub name has (hub names are `name` or `org/name`, of
letters, digits, `-`, `_` and `.`); when it is a folder of the working directory; or when its
part before the `/` is one (`models/student` where `./models` exists). Any other name is a hub
name, left to the hub (or its local cache); `tiny:` names are the embedded models.
"""

import itertools
import os
import re
from pathlib import Path

from nemo_opd.config.errors import closest

TINY_PREFIX = "tiny:"
"""nemo_opd.tiny.TINY_PREFIX (importing the tiny package would import torch)."""
HUB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?")
"""A name the hub can hold: `name` or `org/name`."""
LOCAL_STARTS = ("/", "./", "../", "~")
URL = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://")
MAX_SIBLINGS = 1000
"""Entries beside a missing path compared with its name, at most."""


def looks_local(name: str) -> bool:
    """Whether `name` is a local path, not a hub name or a URL (see the module docstring)."""
    if URL.match(name):
        return False
    if name.startswith(LOCAL_STARTS) or name in (".", "..") or (os.sep != "/" and os.sep in name):
        return True
    if HUB_NAME.fullmatch(name) is None:
        return True
    return is_dir(name) or ("/" in name and is_dir(name.split("/", 1)[0]))


def is_local_model(name: str) -> bool:
    """Whether `name` names a local folder to check: a local path, not a tiny: name."""
    return not name.startswith(TINY_PREFIX) and looks_local(name)


def missing_folder(name: str, key: str) -> str | None:
    """The problem with `name` (the value of config key `key`) when it is a local path to no
    folder, or one written with `~` (which neither a config nor transformers expands); None
    otherwise (a hub or tiny: name, or a folder)."""
    if not is_local_model(name):
        return None
    folder = Path(name).expanduser().absolute()
    if not is_dir(folder):
        what = "not a folder" if folder.exists() else "no such folder"
        return f"{key}: {what}: {folder}{nearest(folder)} (a local path: not asked of the hub)"
    if name.startswith("~"):
        return f"{key}: {name!r} starts with ~, which a config does not expand: write {folder}"
    return None


def nearest(path: Path, folders: bool = True) -> str:
    """'; did you mean X?' for the folder (or, not `folders`, the file) beside the missing
    `path` whose name is closest to its name; "" when none is close."""
    path = path.absolute()
    try:
        entries = itertools.islice(path.parent.iterdir(), MAX_SIBLINGS)
        names = [entry.name for entry in entries if entry.is_dir() == folders]
    except OSError:
        return ""
    match = closest(path.name, names)
    return f"; did you mean {path.parent / match}?" if match else ""


def is_dir(path: str | Path) -> bool:
    """Whether `path` is a folder; False for a name no file can have (too long, a NUL byte)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False
