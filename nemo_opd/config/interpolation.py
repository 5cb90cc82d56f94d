"""`${...}` interpolation, bounded by the work it does, whatever the config holds.

A value may refer to another key, absolute (`${policy.precision}`) or relative
(`${..model_name}`), and call the arithmetic resolvers `${mul:a,...}`, `${add:a,...}`,
`${max:a,...}` and `${div:a,b}` (an int when both are ints and the division is exact); `???`
marks a key a child file or an override must set. A resolver is looked up in RESOLVERS alone,
by the name it has when called, so no spelling reaches another (`${${key}:X}`,
`${oc.${key}:X}`, `\\\\${oc.env:X}`): `oc.env` would copy an environment variable (a
secret) into a config that is printed and logged, `oc.create` parse YAML no bound sees.

Each value is read by OmegaConf's own grammar (its parser and visitor: the same syntax,
escapes and argument types), and the keys it refers to are looked up here, in the plain
config, each resolved once (docs/design.md says why not by OmegaConf). The work is counted as
it is done (_Work), stopping at the first excess of a bound of bounds.py; the nesting of `${`
in one value is checked before the parser recurses. An arithmetic result fits in 64 bits (an
int) or is finite (a float).
"""

import copy
import math
import re
import warnings
from collections.abc import Callable, Iterable
from functools import reduce
from typing import Any

from omegaconf import grammar_parser
from omegaconf.errors import OmegaConfBaseException
from omegaconf.grammar_visitor import GrammarVisitor

from nemo_opd.config.bounds import (
    MAX_INTERPOLATED_CHARS,
    MAX_INTERPOLATION_NESTING,
    MAX_PARSED_CHARS,
    MAX_REFERENCE_CHAIN,
    MAX_RESOLUTIONS,
    MAX_VALUES,
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
    # bounded at each factor: a long product is never computed whole
    return reduce(lambda product, n: _bounded("mul", product * n), _numbers("mul", args), 1)


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
    """Register RESOLVERS with OmegaConf, for code that resolves its own OmegaConf configs with
    them (loading a nemo_opd config does not use OmegaConf's registry); a no-op when done."""
    from omegaconf import OmegaConf

    for name, function in RESOLVERS.items():
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, function)


MISSING = "???"
"""The value of a key that a child file or an override must set."""


def resolve_interpolations(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of plain `config` with every `${...}` replaced by its value; ConfigError naming
    the key whose interpolation failed, the expression and why, or the bound it would pass."""
    try:
        return _Resolution(config).resolved(())[0]
    except RecursionError:
        raise ConfigError(
            "interpolations nest too deeply to resolve (references, brackets or braces within "
            "one another)"
        ) from None


class _Unresolvable(Exception):
    """Why one interpolation cannot be resolved; _Resolution.evaluate names the key."""


_ABSENT = object()
"""What a key path that names nothing leads to."""

Size = tuple[int, int]
"""(characters, values) of a value written out (_size)."""


class _Resolution:
    """One resolve_interpolations call: the resolved value and size of each key path resolved
    so far, the chain of references being followed, and the work done (_Work)."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.done: dict[tuple, tuple[Any, Size]] = {}
        self.active: list[tuple] = []  # the key paths being resolved, outermost first
        self.references = 0  # the length of the chain of references being followed
        self.work = _Work()

    def resolved(self, path: tuple) -> tuple[Any, Size]:
        """(value, size) of the key path, each interpolation in it resolved, computed once."""
        if path in self.done:
            return self.done[path]
        if path in self.active:
            loop = self.active[self.active.index(path) :] + [path]
            raise ConfigError(
                f"{_name(self.active[-1])}: interpolations refer to one another in a cycle: "
                f"{' -> '.join(_name(p) for p in loop)}"
            )
        self.active.append(path)
        try:
            self.done[path] = self._resolve(path, _node_at(self.config, path))
        finally:
            self.active.pop()
        return self.done[path]

    def _resolve(self, path: tuple, raw: Any) -> tuple[Any, Size]:
        """(value, size) of `raw`, the value at `path`."""
        if isinstance(raw, dict):
            parts = {key: self.resolved((*path, key)) for key in raw}
            sizes = [part[1] for part in parts.values()]
            return {key: part[0] for key, part in parts.items()}, _total(sizes, raw)
        if isinstance(raw, list):
            parts = [self.resolved((*path, index)) for index in range(len(raw))]
            return [part[0] for part in parts], _total([part[1] for part in parts])
        if raw == MISSING:
            where = _name(path)
            raise ConfigError(
                f"{where}: mandatory value '???' was never set; set it in a YAML file or as "
                f"{where}=..."
            )
        value = self.evaluate(path, raw) if isinstance(raw, str) and "${" in raw else raw
        return value, _size(value)

    def evaluate(self, path: tuple, text: str) -> Any:
        """The value of `text`, the interpolated value at `path`, read by OmegaConf's grammar."""
        _check_nesting(text, path)
        self.work.parse(path, text)
        visitor = GrammarVisitor(
            node_interpolation_callback=lambda key, memo: self._refer(path, key),
            resolver_interpolation_callback=lambda name, args, args_str: self._call(
                path, name, args
            ),
            memo=None,
        )
        try:
            with warnings.catch_warnings():
                # an empty argument (`${mul:1,,2}`) warns, then reaches the resolver as ""
                warnings.simplefilter("ignore")
                return visitor.visit(grammar_parser.parse(text))
        except ConfigError:
            raise  # about another key, or a bound: it names its key already
        except (_Unresolvable, OmegaConfBaseException, ValueError) as error:
            reason = str(error).splitlines()[0] if str(error) else type(error).__name__
            raise ConfigError(
                f"{_name(path)}: cannot resolve interpolation {show(text, limit=120)}: {reason}"
            ) from None

    def _refer(self, path: tuple, key: str) -> Any:
        """The value `${key}` in the value at `path` refers to (a copy of a section)."""
        target = reference_path(path, key)
        if target is None:
            raise _Unresolvable(f"{key!r} goes above the top of the config")
        if self.references >= MAX_REFERENCE_CHAIN:
            raise ConfigError(
                f"{_name(path)}: a chain of more than {MAX_REFERENCE_CHAIN} interpolations, each "
                "referring to a key whose value is the next; a config does not need this many"
            )
        self.references += 1
        try:
            value, size = self._select(target)
        finally:
            self.references -= 1
        if value is _ABSENT:
            raise _Unresolvable(f"refers to {key!r}, which is not in the config")
        self.work.produce(path, size)
        return copy.deepcopy(value) if isinstance(value, dict | list) else value

    def _select(self, target: tuple) -> tuple[Any, Size]:
        """(value, size) at `target`, resolving an interpolated value on the way (`${a.b}` where
        a is `${c}` is c.b), as OmegaConf does; (_ABSENT, (0, 0)) where there is none."""
        node, path = self.config, ()
        for depth, part in enumerate(target):
            if isinstance(node, str) and "${" in node:
                inner = _node_at(self.resolved(path)[0], target[depth:])
                return inner, _size(inner)
            key = _key_of(node, part)
            if key is _ABSENT:
                return _ABSENT, (0, 0)
            node, path = node[key], (*path, key)
        return self.resolved(path)  # the path as a section walk spells it: one entry in done

    def _call(self, path: tuple, name: str, args: tuple) -> Any:
        """The result of resolver `name` on `args`, if it is one of RESOLVERS."""
        function = RESOLVERS.get(name)
        if function is None:
            raise _Unresolvable(
                f"the resolver {show(name)} is not available{suggest(name, RESOLVERS)}; "
                f"interpolations are references (${{a.b}}, ${{..sibling}}) and "
                f"{', '.join(sorted(RESOLVERS))} (an environment variable never enters a config: "
                "what a run prints and logs stays free of secrets)"
            )
        result = function(*args)
        self.work.produce(path, _size(result))
        return result


class _Work:
    """What resolving one config has done, against bounds.py's bounds: the `${` and characters
    parsed (each value is parsed and evaluated once, so these bound the interpolations
    evaluated), and what references and resolver calls yield, a section counted at every
    reference to it."""

    def __init__(self) -> None:
        self.interpolations = self.parsed = self.chars = self.values = 0

    def parse(self, path: tuple, text: str) -> None:
        """Count `text`, the value at `path`, before it is parsed; ConfigError past a bound."""
        self.interpolations += text.count("${")
        self.parsed += len(text)
        if self.interpolations > MAX_RESOLUTIONS:
            _refuse(path, f"values with interpolations hold more than {MAX_RESOLUTIONS:,} `${{`")
        if self.parsed > MAX_PARSED_CHARS:
            _refuse(
                path,
                f"values with interpolations come to more than {MAX_PARSED_CHARS:,} characters",
            )

    def produce(self, path: tuple, size: Size) -> None:
        """Count what a reference or resolver call in the value at `path` yields."""
        self.chars += size[0]
        self.values += size[1]
        produced = "interpolations would produce more than"
        at_each_use = "(a section counted at every reference to it)"
        if self.chars > MAX_INTERPOLATED_CHARS:
            _refuse(path, f"{produced} {MAX_INTERPOLATED_CHARS:,} characters {at_each_use}")
        if self.values > MAX_VALUES:
            _refuse(path, f"{produced} {MAX_VALUES:,} values {at_each_use}")


def _refuse(path: tuple, excess: str) -> None:
    """ConfigError: the config's `excess` (found at `path`)."""
    raise ConfigError(f"{_name(path)}: the config's {excess}; a config does not need this much")


def _name(path: tuple) -> str:
    """A key path for a message; the whole config's is <config>."""
    return join_path(path) or "<config>"


def _size(value: Any) -> Size:
    """(characters, values) of `value` written out: a section's keys and what they hold, each
    section a value of its own."""
    if isinstance(value, dict):
        return _total([_size(item) for item in value.values()], value)
    if isinstance(value, list):
        return _total([_size(item) for item in value])
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return value.bit_length() // 3, 1  # about its digits; str() refuses past 4,300 of them
    return len(str(value)), 1


def _total(sizes: list[Size], keys: Iterable[Any] = ()) -> Size:
    """The size of a section that holds values of `sizes` under `keys` (a list has none)."""
    key_chars = sum(len(str(key)) for key in keys)
    return key_chars + sum(size[0] for size in sizes), 1 + sum(size[1] for size in sizes)


def _check_nesting(text: str, path: tuple) -> None:
    """ConfigError for `${` nested more than MAX_INTERPOLATION_NESTING deep in `text`."""
    depth = deepest = 0
    for match in re.finditer(r"\$\{|\}", text):
        depth = depth + 1 if match.group() == "${" else max(0, depth - 1)
        deepest = max(deepest, depth)
    if deepest > MAX_INTERPOLATION_NESTING:
        raise ConfigError(
            f"{_name(path)}: interpolations nested {deepest} deep, more than the "
            f"{MAX_INTERPOLATION_NESTING} a value may have"
        )


def reference_path(path: tuple, reference: str) -> tuple | None:
    """The key path `${reference}` names from the value at `path`: absolute (`a.b`, `a[0]`) or
    relative (`.sibling`, `..key_of_parent`), as OmegaConf reads it; None above the top."""
    dots = len(reference) - len(reference.lstrip("."))
    if dots > len(path):
        return None
    base = path[: len(path) - dots] if dots else ()
    rest = reference[dots:].replace("[", ".").replace("]", "").removeprefix(".")
    return (*base, *rest.split(".")) if rest else base


def _key_of(node: Any, part: Any) -> Any:
    """The key or index `part` names in a section (as text, "0" indexes a list or names a key
    0, as in OmegaConf), or _ABSENT when it names none."""
    if isinstance(node, dict):
        if part in node:
            return part
        text = str(part)
        number = int(text) if text.lstrip("-").isdigit() else _ABSENT
        return number if number in node else _ABSENT
    if isinstance(node, list) and str(part).isdigit() and int(part) < len(node):
        return int(part)
    return _ABSENT


def _node_at(config: Any, path: tuple) -> Any:
    """The value at a key path, or _ABSENT when there is none."""
    node = config
    for part in path:
        key = _key_of(node, part)
        if key is _ABSENT:
            return _ABSENT
        node = node[key]
    return node


def interpolated_keys(config: Any, path: tuple[str | int, ...] = ()) -> dict[str, str]:
    """Map each key path whose raw value contains `${` to that raw value (to say, when a
    validated value is wrong, which interpolation produced it)."""
    found: dict[str, str] = {}
    if isinstance(config, dict | list):
        for key, value in config.items() if isinstance(config, dict) else enumerate(config):
            found.update(interpolated_keys(value, (*path, key)))
    elif isinstance(config, str) and "${" in config:
        found[join_path(path)] = config
    return found
