"""Validate a resolved config dict against the schema, reporting problems as one ConfigError."""

import re
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from nemo_opd.config.errors import ConfigError, closest, join_path, show, suggest
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.config.schema_paths import keys_at


def validate_config(
    data: Mapping[str, Any], interpolations: Mapping[str, str] | None = None
) -> DistillationConfig:
    """Build a DistillationConfig from a plain (already resolved) dict.

    `interpolations` maps key paths to the `${...}` expression their value came from, so that
    a message about such a key can say so. Raises ConfigError listing every problem, one per
    line, each naming its full key path.
    """
    try:
        return DistillationConfig.model_validate(dict(data))
    except ValidationError as error:
        problems = describe_validation_error(error, interpolations or {})
        raise ConfigError(format_problems(problems)) from None


def format_problems(problems: list[str]) -> str:
    """One problem as is; several under a header, one per line."""
    if len(problems) == 1:
        return problems[0]
    return f"invalid configuration ({len(problems)} problems):\n" + "\n".join(
        f"  {problem}" for problem in problems
    )


def describe_validation_error(
    error: ValidationError, interpolations: Mapping[str, str]
) -> list[str]:
    """One human line per pydantic error (several for a failed cross-field check)."""
    problems: list[str] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        if not loc:  # a cross-field check: its message already names the keys
            message = item["msg"].removeprefix("Value error, ")
            problems += message.splitlines()
        else:
            path = join_path(loc)
            origin = interpolations.get(path)
            source = f" (from {origin})" if origin else ""
            problems.append(f"{path}: {_explain(item, loc)}{source}")
    return problems


def _explain(item: Mapping[str, Any], loc: tuple[str | int, ...]) -> str:
    """What is wrong at `loc` and what is allowed, in words."""
    kind, value = item["type"], item.get("input")
    if kind == "extra_forbidden":
        return _unknown_key(str(loc[-1]), keys_at(DistillationConfig, loc[:-1]))
    if kind == "missing":
        return "required key is missing"
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a section (a mapping of keys); got {show(value)}"
    message = re.sub(r"^(Input|String|Value|List|Tuple) should ", "must ", item["msg"])
    message = message.removeprefix("Value error, ").replace(", got a ", ", not a ")
    hint = ""
    if kind == "literal_error" and isinstance(value, str):
        choices = re.findall(r"'([^']*)'", item.get("ctx", {}).get("expected", ""))
        match = closest(value, choices)
        hint = f" (did you mean '{match}'?)" if match else ""
    return f"{message}; got {show(value)}{hint}"


def _unknown_key(key: str, valid: list[str]) -> str:
    """Message for a key the section does not accept, with the closest valid key if any."""
    hint = suggest(key, valid)
    if hint:
        return f"unknown key{hint}"
    return f"unknown key; valid keys here: {', '.join(valid)}"
