"""The conversion in progress (Builder) and what it yields (Row, Conversion): shared by
nemo_rl.py, which runs the steps, and nemo_rl_sections.py, which converts the sections that
change shape.
"""

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from nemo_opd.config.bounds import MAX_DEFAULTS_LOADS
from nemo_opd.config.interpolation import RESOLVERS, reference_path
from nemo_opd.config.key_paths import model_at
from nemo_opd.config.loader import read_yaml_file
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.nemo_rl_keys import Kind, fate_of

SECTIONS = (
    "distillation",
    "loss_fn",
    "checkpointing",
    "policy",
    "teacher",
    "data",
    "env",
    "logger",
    "cluster",
)
"""The sections of the converted config, in the order they are written."""

MISSING = object()
"""What value() returns for a key the NeMo-RL config does not have."""


@dataclass
class Row:
    """One NeMo-RL key: what it became (kind), its value there, the key and value here (None
    when dropped) and the note (why it was dropped, or how it differs)."""

    kind: Kind
    source: str
    value: Any
    target: str | None = None
    written: Any = None
    note: str = ""


@dataclass
class Conversion:
    """A converted config (a plain dict, unvalidated) and the rows that explain it."""

    source: Path
    config: dict[str, Any]
    rows: list[Row] = field(default_factory=list)


def inherited_files(path: Path) -> list[Path]:
    """The config file and every file it inherits through `defaults:` (each once, the file
    itself first), as load_with_defaults reads them."""
    files: list[Path] = []
    pending = [path]
    while pending and len(files) < MAX_DEFAULTS_LOADS:
        current = pending.pop(0)
        if current.resolve() in [known.resolve() for known in files]:
            continue
        files.append(current)
        content = read_yaml_file(current)
        parents = content.get("defaults") if isinstance(content, dict) else None
        names = parents if isinstance(parents, list) else [parents] if parents else []
        pending += [current.parent / name for name in names if isinstance(name, str)]
    return files


def leaves(node: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """(path, value) of every key whose value is not a non-empty mapping (a list is a value)."""
    if isinstance(node, dict) and node:
        for key, value in node.items():
            yield from leaves(value, (*path, str(key)))
    elif path:
        yield path, node


class Builder:
    """The conversion in progress: NeMo-RL's config (raw and resolved), the config being
    written, the rows, and the NeMo-RL keys already converted."""

    def __init__(self, source: Path, raw: dict[str, Any], resolved: dict[str, Any]) -> None:
        self.source = source
        self.files = inherited_files(source)
        self.raw, self.resolved = raw, resolved
        self.config: dict[str, Any] = {section: {} for section in SECTIONS}
        self.rows: list[Row] = []
        self.done: set[tuple[str, ...]] = set()

    # ---- reading NeMo-RL's config

    def value(self, path: str | tuple[str, ...], *, raw: bool = False) -> Any:
        """The value at a NeMo-RL key path (resolved unless `raw`), or MISSING."""
        node: Any = self.raw if raw else self.resolved
        for part in _parts(path):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def replace(self, section: str, raw: Any, resolved: Any) -> None:
        """Read `section` of NeMo-RL's config as these values from now on (the first of a list
        of datasets, say)."""
        *parents, key = section.split(".")
        for config, value in ((self.raw, raw), (self.resolved, resolved)):
            node = config
            for part in parents:
                node = node[part]
            node[key] = value

    def is_done(self, path: tuple[str, ...]) -> bool:
        """Whether the key (or a section holding it) has been converted."""
        return any(path[:end] in self.done for end in range(1, len(path) + 1))

    # ---- writing nemo_opd's config

    def written(self, target: str) -> Any:
        """The value written at a key here so far, or MISSING."""
        node: Any = self.config
        for part in target.split("."):
            if not isinstance(node, dict) or part not in node:
                return MISSING
            node = node[part]
        return node

    def write(self, target: str, value: Any) -> None:
        """Set a key of the converted config (its sections created as needed)."""
        *sections, key = target.split(".")
        node = self.config
        for part in sections:
            node = node.setdefault(part, {})
        node[key] = value

    def row(
        self,
        kind: Kind,
        source: str | tuple[str, ...],
        target: str | None = None,
        written: Any = None,
        note: str = "",
        *,
        write: bool = True,
    ) -> None:
        """Record what a NeMo-RL key became and, unless dropped (or `write` is false), write
        `written` at `target`. Marks the key converted."""
        parts = _parts(source)
        value = self.value(parts)
        self.rows.append(Row(kind, ".".join(parts), value, target, written, note))
        self.done.add(parts)
        if kind != "dropped" and target is not None and write:
            self.write(target, written)

    def by_key_map(self, path: tuple[str, ...]) -> None:
        """Step 3: convert one key as the key map says."""
        fate = fate_of(path)
        if fate.kind == "dropped" or fate.target is None:
            self.row("dropped", path, note=fate.note)
            return
        value = self.value(path)
        if fate.kind == "same":
            value = self._as_written(path, fate.target)
        self.row(fate.kind, path, fate.target, value, fate.note)

    def _as_written(self, path: tuple[str, ...], target: str) -> Any:
        """The raw value where it is an interpolation that still holds here (the key keeps its
        path, and every key it names is the same here), else the resolved value."""
        raw = self.value(path, raw=True)
        resolved = self.value(path)
        if not isinstance(raw, str) or "${" not in raw or target != ".".join(path):
            return resolved
        if any(name not in RESOLVERS for name in _RESOLVER_NAME.findall(raw)):
            return resolved
        for reference in _REFERENCE.findall(raw):
            named = reference_path(path, reference)
            if named is None:
                return resolved
            fate = fate_of(named)
            if fate.kind != "same" or fate.target != ".".join(named):
                return resolved
        return raw

    def result(self) -> Conversion:
        """The conversion: empty sections left out, keys in the schema's order."""
        config = {name: section for name, section in self.config.items() if section != {}}
        return Conversion(self.source, _in_schema_order(config, DistillationConfig), self.rows)


_REFERENCE = re.compile(r"\$\{(\.*[A-Za-z_][\w.]*)\}")
_RESOLVER_NAME = re.compile(r"\$\{([\w.]+):")


def _in_schema_order(node: Any, model: type[BaseModel] | None) -> Any:
    """`node` with the keys of every section in the order the schema declares them (the order
    of docs/config.md and of this project's own configs)."""
    if not isinstance(node, dict) or model is None:
        return node
    order = {name: index for index, name in enumerate(model.model_fields)}
    keys = sorted(node, key=lambda key: order.get(key, len(order)))
    return {key: _in_schema_order(node[key], model_at(model, [key])) for key in keys}


def _parts(path: str | tuple[str, ...]) -> tuple[str, ...]:
    return tuple(path.split(".")) if isinstance(path, str) else tuple(path)
