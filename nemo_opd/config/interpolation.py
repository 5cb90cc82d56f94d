"""OmegaConf interpolation (`${a.b}`, `${..sibling}`) and the arithmetic resolvers.

Resolvers: `${mul:a,b,...}`, `${add:a,b,...}`, `${max:a,b,...}` and `${div:a,b}`. Arguments are
numbers or interpolations, e.g. `${mul:${policy.max_total_sequence_length},2}`. `div` returns an
int when both arguments are ints and the division is exact, a float otherwise.
A value of `???` marks a key that must be set by a child file or an override.
"""

import math
from collections.abc import Callable
from functools import reduce
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, UnsupportedInterpolationType

from nemo_opd.config.errors import ConfigError, join_path, show, suggest


def _numbers(name: str, args: tuple[Any, ...], arity: int | None = None) -> tuple[Any, ...]:
    """Check resolver arguments: at least one (or exactly `arity`), all int or float."""
    if arity is not None and len(args) != arity:
        raise ValueError(f"'{name}' takes {arity} arguments, got {len(args)}")
    if not args:
        raise ValueError(f"'{name}' needs at least one argument")
    for arg in args:
        if isinstance(arg, bool) or not isinstance(arg, int | float):
            raise ValueError(f"'{name}' takes numbers, got {show(arg)}")
    return args


def _mul(*args: Any) -> Any:
    return math.prod(_numbers("mul", args))


def _add(*args: Any) -> Any:
    return sum(_numbers("add", args))


def _max(*args: Any) -> Any:
    return reduce(max, _numbers("max", args))


def _div(*args: Any) -> Any:
    numerator, denominator = _numbers("div", args, arity=2)
    if denominator == 0:
        raise ValueError("'div' by zero")
    both_ints = isinstance(numerator, int) and isinstance(denominator, int)
    if both_ints and numerator % denominator == 0:
        return numerator // denominator
    return numerator / denominator


RESOLVERS: dict[str, Callable[..., Any]] = {"mul": _mul, "add": _add, "div": _div, "max": _max}


def register_resolvers() -> None:
    """Register the resolvers with OmegaConf; calling it again is a no-op."""
    register = getattr(OmegaConf, "register_resolver", None) or OmegaConf.register_new_resolver
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            register(name, function)


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """Return a plain dict with every `${...}` replaced by its value.

    Raises ConfigError naming the key whose interpolation failed, the expression, and why.
    """
    register_resolvers()
    try:
        node = OmegaConf.create(config)
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        raise ConfigError(_describe(error, config)) from None


def _describe(error: OmegaConfBaseException, config: dict[str, Any]) -> str:
    """A one-line message for an OmegaConf failure while resolving `config`."""
    key = getattr(error, "full_key", None) or "<config>"
    reason = str(getattr(error, "msg", None) or error).splitlines()[0]
    reason = reason.removeprefix("ValueError raised while resolving interpolation: ")
    if isinstance(error, UnsupportedInterpolationType):
        name = reason.split()[-1]
        reason = f"unknown resolver {name!r}{suggest(name, RESOLVERS)} (nemo_opd provides: "
        reason += ", ".join(sorted(RESOLVERS)) + ")"
    raw = _lookup(config, str(key))
    if raw == "???":
        return f"{key}: mandatory value '???' was never set; set it in a YAML file or as {key}=..."
    expression = f" {show(raw, limit=120)}" if isinstance(raw, str) else ""
    return f"{key}: cannot resolve interpolation{expression}: {reason}"


def _lookup(config: Any, dotted: str) -> Any:
    """The raw value at a dotted OmegaConf key such as `a.b[0].c`, or None if absent."""
    node = config
    for part in dotted.replace("[", ".").replace("]", "").split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node


def interpolated_keys(config: Any, path: tuple[str | int, ...] = ()) -> dict[str, str]:
    """Map each key path whose raw value contains `${` to that raw value.

    Used to say, when a validated value is wrong, which interpolation produced it.
    """
    if isinstance(config, dict):
        items = config.items()
    elif isinstance(config, list):
        items = enumerate(config)
    else:
        return {join_path(path): config} if isinstance(config, str) and "${" in config else {}
    found: dict[str, str] = {}
    for key, value in items:
        found.update(interpolated_keys(value, (*path, key)))
    return found
