"""Parse YAML text strictly: duplicate keys are errors and syntax errors carry file:line.

Two departures from PyYAML's YAML 1.1 defaults, both to match what users expect:
- `1e-5` is a float (YAML 1.1 reads it as a string because it has no dot);
- dates such as `2024-01-01` stay strings (a run name is not a datetime).
"""

import re
from pathlib import Path
from typing import Any

import yaml

from nemo_opd.config.errors import ConfigError

_FLOAT_WITHOUT_DOT = re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$")


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys and keeps dates as strings."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, str | int | float | bool | None):
                continue  # unhashable keys are left for the schema to reject
            if key in seen:
                first = seen[key].line + 1
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {key!r} (first defined on line {first})",
                    key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


StrictLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", _FLOAT_WITHOUT_DOT, list("-+0123456789")
)
StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def parse_yaml(text: str, source: str) -> Any:
    """Parse one YAML document; `source` names it in error messages (a file path or 'override')."""
    try:
        return yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as error:
        raise ConfigError(_describe(error, source)) from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: invalid YAML: {error}") from None


def read_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file, turning a missing or unreadable file into a ConfigError."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except IsADirectoryError:
        raise ConfigError(f"config path is a directory, not a file: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    return parse_yaml(text, str(path))


def _describe(error: yaml.MarkedYAMLError, source: str) -> str:
    """One-line description of a YAML syntax error: `file:line:column: problem`."""
    mark = error.problem_mark or error.context_mark
    where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
    problem = error.problem or error.context or "syntax error"
    return f"{where}: invalid YAML: {problem}"
