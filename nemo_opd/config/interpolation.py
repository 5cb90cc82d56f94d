"""`${...}` interpolation, bounded whatever the config holds.

What a config may interpolate: references to other keys, absolute (`${policy.precision}`) or
relative (`${..model_name}`, `${...max_total_sequence_length}`), and the arithmetic resolvers
`${mul:a,b,...}`, `${add:a,b,...}`, `${max:a,b,...}` and `${div:a,b}` over numbers and
interpolations. `div` returns an int when both arguments are ints and the division is exact, a
float otherwise. A value of `???` marks a key that must be set by a child file or an override.

Nothing else: OmegaConf's own resolvers (`oc.env`, `oc.select`, `oc.decode`, `oc.create`, ...)
are refused. `oc.env` would copy any environment variable, a secret among them, into a config
that is printed and logged; the others re-evaluate their arguments at every level of a chain
of references, which no size bound sees (docs/config.md).

Bounded before OmegaConf resolves anything (check_interpolations), in one pass over the config:
- the text (or section) an interpolation resolves to: at most MAX_INTERPOLATED_CHARS;
- the resolutions OmegaConf performs (it does not remember a key it resolved once, so a chain
  of keys that each refer to the previous one twice costs 2**n): at most MAX_RESOLUTIONS;
- `${` nested within one value: at most MAX_INTERPOLATION_NESTING.
An arithmetic result must fit in 64 bits (an integer) or be finite (a float).
"""

import math
import re
from collections.abc import Callable
from functools import reduce
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException, UnsupportedInterpolationType

from nemo_opd.config.bounds import (
    MAX_INTERPOLATED_CHARS,
    MAX_INTERPOLATION_NESTING,
    MAX_RESOLUTIONS,
)
from nemo_opd.config.errors import ConfigError, join_path, show, suggest

LARGEST_INT = 2**63 - 1
"""The largest integer a config value may be (and an arithmetic resolver may return)."""


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


def _bounded(name: str, value: int | float) -> int | float:
    """A resolver's result, if it fits in 64 bits (int) or is finite (float)."""
    if isinstance(value, int) and abs(value) > LARGEST_INT:
        raise ValueError(f"'{name}' gives an integer of more than 64 bits")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"'{name}' gives {value}, not a finite number")
    return value


def _mul(*args: Any) -> Any:
    numbers = _numbers("mul", args)
    product: int | float = 1
    for number in numbers:  # stop at the first excess: a long product is never computed whole
        product = _bounded("mul", product * number)
    return product


def _add(*args: Any) -> Any:
    return _bounded("add", sum(_numbers("add", args)))


def _max(*args: Any) -> Any:
    return reduce(max, _numbers("max", args))


def _div(*args: Any) -> Any:
    numerator, denominator = _numbers("div", args, arity=2)
    if denominator == 0:
        raise ValueError("'div' by zero")
    both_ints = isinstance(numerator, int) and isinstance(denominator, int)
    if both_ints and numerator % denominator == 0:
        return numerator // denominator
    return _bounded("div", numerator / denominator)


RESOLVERS: dict[str, Callable[..., Any]] = {"mul": _mul, "add": _add, "div": _div, "max": _max}


def register_resolvers() -> None:
    """Register the resolvers with OmegaConf; calling it again is a no-op."""
    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """Return a plain dict with every `${...}` replaced by its value.

    Raises ConfigError naming the key whose interpolation failed, the expression, and why.
    """
    register_resolvers()
    check_interpolations(config)
    try:
        node = OmegaConf.create(config)
        return OmegaConf.to_container(node, resolve=True, throw_on_missing=True)
    except OmegaConfBaseException as error:
        raise ConfigError(_describe_interpolation_error(error, config)) from None
    except RecursionError:
        raise ConfigError("interpolations nest too deeply to resolve") from None


_INNERMOST = re.compile(r"\$\{([^${}]*)\}")
_RESOLVER = re.compile(r"(?<!\\)\$\{\s*([A-Za-z_][\w.\-]*)\s*:")
_RESOLVER_RESULT_CHARS = 32  # a number from mul/add/max/div, as text


def check_interpolations(config: dict[str, Any]) -> None:
    """ConfigError for a resolver other than RESOLVERS, or an interpolation past a bound of
    the module docstring, before OmegaConf resolves any of it.

    Sizes and costs are estimated bottom-up, once per key: a text's size is its literal part
    plus the sizes of what it refers to, a section's the sum of its values'; its cost (the
    resolutions OmegaConf performs for it) is one per `${...}` plus the costs of what it refers
    to. So a chain of keys that each refer to the previous one twice is refused at the first
    key over a bound, at the cost of one pass over the config.
    """
    sizes: dict[tuple, tuple[int, int]] = {}
    total = 0

    def measure(path: tuple) -> tuple[int, int]:
        """(size, cost) of the value at path."""
        if path in sizes:
            return sizes[path]
        sizes[path] = (0, 0)  # a cycle counts as empty here; OmegaConf reports it by name
        value = _node_at(config, path)
        if isinstance(value, dict | list):
            keys = value if isinstance(value, dict) else range(len(value))
            parts = [measure((*path, key)) for key in keys]
            size, cost = sum(p[0] for p in parts), sum(p[1] for p in parts)
        elif isinstance(value, str) and "${" in value:
            _check_resolvers(value, path)
            size, cost = _interpolated_size(value, path, measure)
        else:
            size, cost = len(str(value)), 0
        if size > MAX_INTERPOLATED_CHARS:
            raise ConfigError(
                f"{join_path(path)}: its interpolations resolve to more than "
                f"{MAX_INTERPOLATED_CHARS:,} characters; a config does not need this much"
            )
        if cost > MAX_RESOLUTIONS:
            raise ConfigError(_too_costly(path))
        sizes[path] = (size, cost)
        return size, cost

    try:
        for path, value in _leaves(config, ()):
            if isinstance(value, str) and "${" in value:
                total += measure(path)[1]  # OmegaConf resolves every value on its own
                if total > MAX_RESOLUTIONS:
                    raise ConfigError(_too_costly(path))
    except RecursionError:
        raise ConfigError("interpolations refer to one another too many levels deep") from None


def _too_costly(path: tuple) -> str:
    return (
        f"{join_path(path)}: resolving the config's interpolations would take more than "
        f"{MAX_RESOLUTIONS:,} steps (keys that refer to others several times, chained); a "
        "config does not need this much"
    )


def _check_resolvers(text: str, path: tuple) -> None:
    """ConfigError for a resolver other than RESOLVERS, or `${` nested too deeply."""
    for name in _RESOLVER.findall(text):
        if name not in RESOLVERS:
            hint = suggest(name, RESOLVERS)
            raise ConfigError(
                f"{join_path(path)}: cannot resolve interpolation {show(text, limit=120)}: "
                f"the resolver {name!r} is not available{hint}; "
                f"interpolations are references (${{a.b}}, ${{..sibling}}) and "
                f"{', '.join(sorted(RESOLVERS))} (an environment variable never enters a config: "
                "what a run prints and logs stays free of secrets)"
            )
    depth = deepest = 0
    for match in re.finditer(r"\$\{|\}", text):
        depth = depth + 1 if match.group() == "${" else max(0, depth - 1)
        deepest = max(deepest, depth)
    if deepest > MAX_INTERPOLATION_NESTING:
        raise ConfigError(
            f"{join_path(path)}: interpolations nested {deepest} deep, more than the "
            f"{MAX_INTERPOLATION_NESTING} a value may have"
        )


def _interpolated_size(
    text: str, path: tuple, measure: Callable[[tuple], tuple[int, int]]
) -> tuple[int, int]:
    """(size, cost) of `text` at `path` once its `${...}` are resolved (innermost first)."""
    size = cost = 0
    while match := _INNERMOST.search(text):
        inner = match.group(1).strip()
        cost += 1
        if ":" in inner.split(".", 1)[0] or _RESOLVER.match(match.group()):  # e.g. mul:8,2
            size += _RESOLVER_RESULT_CHARS
        else:
            target = _reference_path(path, inner)
            if target is not None:
                target_size, target_cost = measure(target)
                size, cost = size + target_size, cost + target_cost
        text = text[: match.start()] + text[match.end() :]
        if size > MAX_INTERPOLATED_CHARS or cost > MAX_RESOLUTIONS:
            break
    return size + len(text), cost


def _leaves(node: Any, path: tuple):
    """(path, value) of every value that is not a section."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, (*path, key))
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _leaves(value, (*path, index))
    else:
        yield path, node


def _reference_path(path: tuple, reference: str) -> tuple | None:
    """The key path `${reference}` names from the value at `path`: absolute (`a.b`) or
    relative (`.sibling`, `..key_of_parent`), as OmegaConf reads it; None if malformed."""
    dots = len(reference) - len(reference.lstrip("."))
    rest = reference[dots:]
    base = path[: len(path) - dots] if dots else ()
    if dots > len(path):
        return None
    return (*base, *_key_parts(rest)) if rest else base


def _node_at(config: Any, path: tuple) -> Any:
    """The value at a key path, or None when there is none."""
    node = config
    for part in path:
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if not (in_dict or in_list):
            return None
        node = node[part]
    return node


def _describe_interpolation_error(error: OmegaConfBaseException, config: dict[str, Any]) -> str:
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
    return _node_at(config, _key_parts(dotted.replace("[", ".").replace("]", "")))


def _key_parts(dotted: str) -> tuple:
    """`a.b.0` -> ("a", "b", 0): digits index lists."""
    return tuple(int(part) if part.isdigit() else part for part in dotted.split("."))


def interpolated_keys(config: Any, path: tuple[str | int, ...] = ()) -> dict[str, str]:
    """Map each key path whose raw value contains `${` to that raw value.

    Used to say, when a validated value is wrong, which interpolation produced it.
    """
    return {
        join_path(key): value
        for key, value in _leaves(config, path)
        if isinstance(value, str) and "${" in value
    }
