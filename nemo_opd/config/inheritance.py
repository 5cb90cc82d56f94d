"""`defaults:` inheritance: a YAML file extends one or more other files.

A file may start with `defaults: base.yaml` or `defaults: [a.yaml, b.yaml]`. Paths are relative
to the including file. The listed files are loaded (recursively) and deep-merged in order, then
the including file is merged on top: later wins, mappings merge key by key, anything else
(lists included) is replaced whole. A file that includes itself, directly or not, is an error.
"""

from pathlib import Path
from typing import Any

from nemo_opd.config.errors import ConfigError
from nemo_opd.config.yaml_io import read_yaml_file

DEFAULTS_KEY = "defaults"


def load_with_defaults(path: str | Path) -> dict[str, Any]:
    """Load a YAML config file and everything it inherits, merged into one plain dict."""
    return _load(Path(path), chain=())


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return a new dict: `override` merged into `base`, recursing where both sides are dicts."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _load(path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
    """Load `path` with its defaults; `chain` is the stack of files that led here."""
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(p.name for p in (*chain[chain.index(resolved) :], resolved))
        raise ConfigError(f"circular `defaults:` inheritance: {cycle}")
    content = read_yaml_file(path)
    if content is None:
        return {}
    if not isinstance(content, dict):
        kind = type(content).__name__
        raise ConfigError(f"{path}: a config file must be a mapping of keys, got a {kind}")
    merged: dict[str, Any] = {}
    for parent in _parents(content.pop(DEFAULTS_KEY, None), path):
        merged = deep_merge(merged, _load(parent, (*chain, resolved)))
    return deep_merge(merged, content)


def _parents(entry: Any, path: Path) -> list[Path]:
    """The files listed under `defaults:` in `path`, resolved relative to its directory."""
    if entry is None:
        return []
    entries = entry if isinstance(entry, list) else [entry]
    for item in entries:
        if not isinstance(item, str) or not item.strip():
            raise ConfigError(
                f"{path}: `defaults:` must be a file name or a list of file names, got {item!r}"
            )
    parents = [path.parent / item for item in entries]
    for item, parent in zip(entries, parents, strict=True):
        if not parent.is_file():
            raise ConfigError(f"{path}: `defaults:` entry {item!r} not found (looked for {parent})")
    return parents
