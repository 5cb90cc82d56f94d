"""Hydra-style command-line overrides, applied to the merged config dict before validation.

    a.b=v      set a key; it must be set in the YAML or be a key of the schema
    +a.b=v     add a key that is not set yet
    ++a.b=v    set or add, whichever applies
    ~a.b       delete a key;  ~a.b=v deletes it only if its value is v

Values are parsed as YAML: `3`, `1e-5`, `true`, `null`, `[1, 2]`, `{x: 1}`, `'quoted'`,
`${policy.max_total_sequence_length}`. An empty value (`a.b=`) is the empty string.
"""

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

import yaml
from pydantic import BaseModel

from nemo_opd.config.errors import ConfigError, show, suggest
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.config.schema_paths import has_path, keys_at
from nemo_opd.config.yaml_io import StrictLoader

Operation = Literal["set", "add", "force", "delete"]

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")
_NO_VALUE = object()


@dataclass(frozen=True)
class Override:
    """One parsed override: what to do, at which key path, with which value."""

    operation: Operation
    path: tuple[str, ...]
    value: Any
    text: str

    @property
    def key(self) -> str:
        """The dotted key path."""
        return ".".join(self.path)


def parse_override(text: str) -> Override:
    """Parse `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b` or `~a.b=v`."""
    operation, rest = _split_prefix(text)
    key, sep, raw_value = rest.partition("=")
    key = key.strip()
    if not sep and operation != "delete":
        raise ConfigError(
            f"override {text!r} has no '=': write key=value (or ~key to delete a key)"
        )
    if not key:
        raise ConfigError(f"override {text!r} has an empty key: write key=value")
    if not _KEY.match(key):
        raise ConfigError(
            f"override {text!r}: {key!r} is not a key path "
            "(dotted names such as policy.optimizer.lr)"
        )
    value = _parse_value(raw_value, text) if sep else _NO_VALUE
    return Override(operation, tuple(key.split(".")), value, text)


def apply_overrides(
    config: dict[str, Any],
    overrides: Iterable[str],
    schema: type[BaseModel] = DistillationConfig,
) -> dict[str, Any]:
    """Return a copy of `config` with the overrides applied in order."""
    result = copy.deepcopy(config)
    for text in overrides:
        _apply(result, parse_override(text), schema)
    return result


def _split_prefix(text: str) -> tuple[Operation, str]:
    """Separate the operation prefix (~, ++, +) from the rest of the override."""
    if text.startswith("~"):
        return "delete", text[1:]
    if text.startswith("++"):
        return "force", text[2:]
    if text.startswith("+"):
        return "add", text[1:]
    return "set", text


def _parse_value(raw: str, text: str) -> Any:
    """Parse the value as YAML; the empty value is the empty string."""
    if raw == "":
        return ""
    try:
        return yaml.load(raw, Loader=StrictLoader)
    except yaml.YAMLError as error:
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(
            f"override {text!r}: cannot parse the value {raw!r} as YAML ({problem}); "
            "quote strings, e.g. key='a: b'"
        ) from None


def _apply(config: dict[str, Any], override: Override, schema: type[BaseModel]) -> None:
    """Apply one override to `config` in place."""
    parent = _parent_section(config, override, schema)
    key, path = override.path[-1], override.path
    if override.operation == "set" and key not in parent and not has_path(schema, path):
        _fail(override, f"unknown key {override.key}{_hint(key, parent, path[:-1], schema)}")
    elif override.operation == "add" and key in parent:
        _fail(
            override,
            f"{override.key} is already set (to {show(parent[key])}); use "
            f"{override.key}=... to change it, or ++{override.key}=...",
        )
    elif override.operation == "delete":
        _delete(parent, override, schema)
        return
    parent[key] = override.value


def _parent_section(
    config: dict[str, Any], override: Override, schema: type[BaseModel]
) -> dict[str, Any]:
    """The dict that holds the override's last key, creating missing sections where allowed."""
    node = config
    for depth, part in enumerate(override.path[:-1]):
        here = override.path[: depth + 1]
        child = node.get(part)
        if child is None:
            if override.operation == "delete":
                hint = _hint(part, node, here[:-1], schema)
                _fail(override, f"cannot delete {override.key}: {'.'.join(here)} is not set{hint}")
            if override.operation == "set" and part not in node and not has_path(schema, here):
                hint = _hint(part, node, here[:-1], schema)
                _fail(override, f"unknown key {'.'.join(here)}{hint}")
            child = node[part] = {}
        if not isinstance(child, dict):
            _fail(override, f"{'.'.join(here)} is {show(child)}, not a section with keys")
        node = child
    return node


def _delete(parent: dict[str, Any], override: Override, schema: type[BaseModel]) -> None:
    """Delete the override's key, if present and (when a value is given) equal to it."""
    key = override.path[-1]
    if key not in parent:
        hint = _hint(key, parent, override.path[:-1], schema)
        _fail(override, f"cannot delete {override.key}: it is not set{hint}")
    if override.value is not _NO_VALUE and parent[key] != override.value:
        _fail(
            override,
            f"not deleted: {override.key} is {show(parent[key])}, not {show(override.value)}",
        )
    del parent[key]


def _hint(key: str, section: dict[str, Any], path: tuple[str, ...], schema: type[BaseModel]) -> str:
    """'; did you mean ...?' from the keys set in `section` and those the schema allows."""
    return suggest(key, [*section, *keys_at(schema, path)])


def _fail(override: Override, message: str) -> NoReturn:
    """Raise a ConfigError that quotes the override."""
    raise ConfigError(f"override {override.text!r}: {message}")
