"""The bounds on loading a config, whatever the input (see loader.py's docstring)."""

from typing import Any

from nemo_opd.config.errors import ConfigError

MAX_FILE_BYTES = 1 << 20
"""Largest config file read (configs are a few kilobytes)."""

MAX_VALUES = 100_000
"""Most values (mappings, lists and scalars, each alias use counted again) in a parsed file, an
override's value, or the merged config."""

MAX_DEPTH = 64
"""Deepest nesting of mappings and lists."""

MAX_DEFAULTS_LOADS = 256
"""Most files `defaults:` may load for one config, counting a file each time it is listed."""

MAX_INTERPOLATED_CHARS = 1 << 20
"""Most characters the interpolations of one config may produce, counting what each reference
and resolver call yields (a section's text at every reference to it)."""

MAX_RESOLUTIONS = 2_000
"""Most interpolations (`${...}`: references and resolver calls) in the values of one config
that hold any; each is evaluated once."""

MAX_PARSED_CHARS = 1 << 16
"""Most characters in the values of one config that hold interpolations (what OmegaConf's
parser reads)."""

MAX_REFERENCE_CHAIN = 32
"""Longest chain of references: a key whose value refers to a key whose value refers on."""

MAX_INTERPOLATION_NESTING = 16
"""Deepest nesting of `${...}` within one value."""

MAX_TEACHERS = 64
"""Most teachers a run may route between (`teachers`); each starts its own workers."""

MAX_PROBLEMS_SHOWN = 20
"""Problems listed in one message; the rest are counted."""

MAX_KEY_CHARS = 256
"""Longest key path an override may name (checked before the override is parsed)."""

MAX_OVERRIDE_CHARS = 1 << 16
"""Longest command-line override (key and value); checked before it is parsed."""


def check_integers(data: Any, source: str, path: str = "") -> None:
    """ConfigError naming the key of an integer that does not fit in 64 bits (no setting needs
    one, and YAML, JSON and repr() of one with thousands of digits fail or crawl)."""
    if isinstance(data, dict):
        for key, value in data.items():
            check_integers(value, source, f"{path}.{key}" if path else str(key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            check_integers(value, source, f"{path}[{index}]")
    elif isinstance(data, int) and not isinstance(data, bool) and data.bit_length() > 63:
        where = path or source
        raise ConfigError(
            f"{where}: an integer of {data.bit_length()} bits; values must fit in 64 bits"
        )


def check_size(data: Any, source: str) -> None:
    """ConfigError when `data`, with every shared (aliased) value counted at each use, holds
    more than MAX_VALUES values or nests deeper than MAX_DEPTH. Stops at the first excess, so
    its cost is bounded however large the expansion would be (a self-referencing alias too)."""
    count, stack = 0, [(data, 0)]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_VALUES:
            raise ConfigError(
                f"{source}: more than {MAX_VALUES:,} values once YAML aliases are expanded; "
                "a config this large is a mistake (an alias used too often, for one)"
            )
        if depth > MAX_DEPTH:
            raise ConfigError(f"{source}: values nested more than {MAX_DEPTH} levels deep")
        values = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((value, depth + 1) for value in values)
