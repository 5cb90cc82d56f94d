"""Command-line overrides, in Hydra's grammar, read by hydra-core's own parser.

    a.b=v      set a key; it must be set in the YAML or be a key of the schema
    +a.b=v     add a key that is not set yet
    ++a.b=v    set or add, whichever applies
    ~a.b       delete a key;  ~a.b=v deletes it only if its value is v

Values are Hydra's (docs/config.md lists them and when to quote). What Hydra offers beyond one
run is refused with the reason: sweeps (multirun), config groups (`a/b=c`) and packages
(`a@p=c`). The key is checked (a dotted path of names) before the parser sees it, so each
message names the override and says what to write instead.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from typing import Any, Literal, NoReturn

from pydantic import BaseModel

from nemo_opd.config.bounds import MAX_DEPTH, MAX_KEY_CHARS, MAX_OVERRIDE_CHARS, check_size
from nemo_opd.config.errors import ConfigError, show, suggest
from nemo_opd.config.key_paths import has_path, keys_at
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.nemo_rl_keys import unknown_key_hint

Operation = Literal["set", "add", "force", "delete"]

_KEY = re.compile(r"^[A-Za-z_][\w-]*(\.[A-Za-z_][\w-]*)*$")
_NO_VALUE = object()
_OPERATIONS = {"CHANGE": "set", "ADD": "add", "FORCE_ADD": "force", "DEL": "delete"}
_QUOTE_HINT = (
    "quote a value that holds = # ! ~ > , non-ASCII letters or an interpolation with resolver "
    "arguments, e.g. key='a=b' or key='${mul:${a},2}'"
)


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


@cache
def _parser():
    """hydra-core's override parser (built once: it loads Hydra's grammar)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    return OverridesParser.create()


def parse_override(text: str) -> Override:
    """Parse `a.b=v`, `+a.b=v`, `++a.b=v`, `~a.b` or `~a.b=v` (see the module docstring)."""
    from hydra.errors import HydraException

    if len(text) > MAX_OVERRIDE_CHARS:
        raise ConfigError(
            f"override {show(text)} has {len(text):,} characters, more than the "
            f"{MAX_OVERRIDE_CHARS:,} an override may have; put large values in the config file"
        )
    _check_key(text)
    try:
        parsed = _parser().parse_override(text)
    except RecursionError:
        raise ConfigError(
            f"override {show(text)}: its value is nested more than {MAX_DEPTH} levels deep"
        ) from None
    except ValueError as error:  # an integer of more digits than Python converts, for one
        reason = str(error).split(";")[0]
        raise ConfigError(f"override {show(text)}: invalid value: {reason}") from None
    except HydraException as error:
        raw = text.partition("=")[2]
        reason = str(error).strip().splitlines()[0]
        raise ConfigError(
            f"override {show(text)}: cannot read the value {show(raw)} ({reason}); {_QUOTE_HINT}"
        ) from None
    if parsed.is_sweep_override():
        raise ConfigError(
            f"override {show(text)}: {show(text.partition('=')[2])} is a Hydra sweep (multirun), "
            "and a run takes one value; for a list write [a, b], for a string with commas "
            "quote it: key='a,b'"
        )
    value = _NO_VALUE if parsed.value_type is None else parsed.value()
    check_size(value, f"override {show(text)}")
    operation = _OPERATIONS[parsed.type.name]
    return Override(operation, tuple(parsed.key_or_group.split(".")), value, text)


def _check_key(text: str) -> None:
    """Refuse an override without '=', with an empty key, or whose key is not a dotted path
    (a Hydra config group a/b or package a@p included), with what to write instead."""
    prefix = next((prefix for prefix in ("~", "++", "+") if text.startswith(prefix)), "")
    key, sep, _ = text[len(prefix) :].partition("=")
    key = key.strip()
    if not sep and prefix != "~":  # ~key deletes, without a value
        raise ConfigError(
            f"override {show(text)} has no '=': write key=value (or ~key to delete a key)"
        )
    if not key:
        raise ConfigError(f"override {show(text)} has an empty key: write key=value")
    if len(key) > MAX_KEY_CHARS or key.count(".") >= MAX_DEPTH:
        raise ConfigError(
            f"override {show(text)}: its key has {len(key):,} characters in "
            f"{key.count('.') + 1:,} parts, more than a config has (at most {MAX_KEY_CHARS} "
            f"characters, {MAX_DEPTH} parts)"
        )
    if not _KEY.match(key):
        extra = ""
        if "/" in key or "@" in key:
            extra = "; config groups (a/b=c) and packages (a@p=c) are Hydra's, not nemo_opd's"
        raise ConfigError(
            f"override {show(text)}: {show(key)} is not a key path "
            f"(dotted names such as policy.optimizer.lr){extra}"
        )


def apply_overrides(
    config: dict[str, Any], overrides: Iterable[str], schema: type[BaseModel] = DistillationConfig
) -> dict[str, Any]:
    """Return a copy of `config` with the overrides applied in order."""
    result = copy.deepcopy(config)
    for text in overrides:
        _apply(result, parse_override(text), schema)
    return result


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
            hint = _hint(part, node, here[:-1], schema)
            if override.operation == "delete":
                _fail(override, f"cannot delete {override.key}: {'.'.join(here)} is not set{hint}")
            if override.operation == "set" and part not in node and not has_path(schema, here):
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
    """What NeMo-RL's key of that path is here, if it is one; else '; did you mean ...?' from
    the keys set in `section` and those the schema allows."""
    nemo_rl = unknown_key_hint((*path, key))
    if nemo_rl:
        return f"; {nemo_rl}"
    return suggest(key, [*section, *keys_at(schema, path)])


def _fail(override: Override, message: str) -> NoReturn:
    """Raise a ConfigError that quotes the override."""
    raise ConfigError(f"override {show(override.text)}: {message}")
