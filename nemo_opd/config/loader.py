"""load_config: a YAML file (with `defaults:`) + command-line overrides -> a validated config.

The steps, in order (docs/config.md tells users the same):
1. read the file strictly (duplicate keys are errors, syntax errors carry file:line) and
   everything it inherits through `defaults:` (paths relative to the including file; later
   files win, mappings merge key by key, lists are replaced whole), with each file's relative
   paths made absolute against its own folder;
2. apply the command-line overrides (overrides.py, Hydra's grammar) to that merged dict;
3. resolve `${...}` interpolations (interpolation.py), so an override changes every value
   that refers to it;
4. validate against the schema, then run the cross-field checks (checks.py).
Every failure along the way is a ConfigError with one message naming the key path. to_yaml
turns a validated config back into YAML that load_config reads to an equal config.

Reading is bounded whatever the input (bounds.py): the file's size, the values once aliases
and merge keys are expanded (counted before they are copied), their depth, and the files
`defaults:` loads. YAML departs from PyYAML's YAML 1.1 twice, as users expect: `1e-5` is a
float, and `2024-01-01` stays a string. Anchors, aliases and merge keys (`<<: *policy`, as
NeMo-RL's configs are written) work, and each use of an alias is a copy of its own, so an
override of `policy.x` never changes a `teacher.x` merged from it.
"""

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from nemo_opd.config.bounds import (
    MAX_DEFAULTS_LOADS,
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_PROBLEMS_SHOWN,
    MAX_TEACHERS,
    MAX_VALUES,
    check_integers,
    check_size,
)
from nemo_opd.config.checks import find_problems
from nemo_opd.config.errors import (
    ConfigError,
    closest,
    closest_key,
    join_path,
    show,
    show_path,
    suggest,
)
from nemo_opd.config.interpolation import MISSING, interpolated_keys, resolve_interpolations
from nemo_opd.config.key_paths import keys_at
from nemo_opd.config.overrides import apply_overrides
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.nemo_rl_keys import CONVERTER, unknown_key_hint
from nemo_opd.secrets import redact_user_info

# -------- the steps -------------------------------------------------------------------------------


def compose_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Steps 1-3: the merged, overridden and interpolated config as a plain dict (unvalidated)."""
    return resolve_interpolations(_merge_and_override(path, overrides))


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DistillationConfig:
    """Load, override, interpolate and validate a distillation config file."""
    overridden = _merge_and_override(path, overrides)
    resolved = resolve_interpolations(overridden)
    check_integers(resolved, "the config")
    return validate_config(resolved, interpolations=interpolated_keys(overridden))


def _merge_and_override(path: str | Path, overrides: Sequence[str]) -> dict[str, Any]:
    """Steps 1-2: the file merged with its `defaults:`, then the overrides applied."""
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of strings, not a single string")
    merged = apply_overrides(load_with_defaults(path), overrides)
    check_size(merged, "the merged config")
    return merged


# -------- 1. reading YAML -------------------------------------------------------------------------


_FLOAT_WITHOUT_DOT = re.compile(r"^[-+]?[0-9]+[eE][-+]?[0-9]+$")
_MERGE_TAG = "tag:yaml.org,2002:merge"
_VALUE_TAG = "tag:yaml.org,2002:value"
_SIMPLE_KEY = str | int | float | bool | None


class StrictLoader(yaml.SafeLoader):
    """SafeLoader that rejects duplicate keys, keeps dates as strings, and expands merge keys
    (`<<: *anchor`, `<<: [*a, *b]`) within a bound on the work.

    A merge copies the merged mappings' keys into the mapping that names them: the mapping's
    own keys win, then the first of `[*a, *b]`. Each mapping is expanded once, keeping only the
    pairs that survive, and the pairs all the merges of one document copy are counted before
    each copy: past MAX_VALUES the document is refused, so one mapping merged into thousands
    (a few hundred kilobytes asking for billions of copies) costs no more than the bound.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self.expanded: set[int] = set()  # id() of the mapping nodes expanded so far
        self.merged_pairs = 0

    def flatten_mapping(self, node: yaml.MappingNode) -> None:
        """Expand `node`'s merge keys in place (see the class docstring)."""
        self._expand(node, chain=())

    def _expand(self, node: yaml.MappingNode, chain: tuple[int, ...]) -> None:
        if id(node) in self.expanded:
            return
        if id(node) in chain:
            raise _refused("a merge key (<<) includes the mapping it is in", node.start_mark)
        if len(chain) >= MAX_DEPTH:
            raise _refused(f"merge keys (<<) nested more than {MAX_DEPTH} deep", node.start_mark)
        own, sources = [], []
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG:
                sources += _merge_sources(value_node)
            else:
                if key_node.tag == _VALUE_TAG:  # `=` as a key is the text "="
                    key_node.tag = "tag:yaml.org,2002:str"
                own.append((key_node, value_node))
        seen = self._own_keys(own)
        merged = []
        for source in sources:
            self._expand(source, (*chain, id(node)))
            self._count(len(source.value), node)
            for key_node, value_node in source.value:
                key = self.construct_object(key_node, deep=True)
                if isinstance(key, _SIMPLE_KEY):
                    if key in seen:
                        continue
                    seen.add(key)
                merged.append((key_node, value_node))
        node.value = merged + own
        self.expanded.add(id(node))

    def _own_keys(self, pairs: list[tuple[yaml.Node, yaml.Node]]) -> set:
        """The keys written in a mapping itself; a duplicate is an error."""
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in pairs:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, _SIMPLE_KEY):
                continue  # unhashable keys are left for the schema to reject
            if key in seen:
                first = seen[key].line + 1
                raise _refused(
                    f"duplicate key {key!r} (first defined on line {first})", key_node.start_mark
                )
            seen[key] = key_node.start_mark
        return set(seen)

    def _count(self, pairs: int, node: yaml.Node) -> None:
        """Add a merge's pairs to the document's count; refuse the document past MAX_VALUES."""
        self.merged_pairs += pairs
        if self.merged_pairs > MAX_VALUES:
            raise _refused(
                f"more than {MAX_VALUES:,} values once YAML merge keys (<<) are expanded; a "
                "config this large is a mistake (a mapping merged too often, for one)",
                node.start_mark,
            )


def _refused(problem: str, mark: yaml.Mark) -> yaml.constructor.ConstructorError:
    """A YAML error at `mark` (parse_yaml reports it as file:line:column: problem)."""
    return yaml.constructor.ConstructorError(None, None, problem, mark)


def _merge_sources(value: yaml.Node) -> list[yaml.MappingNode]:
    """The mappings a merge key names: one mapping, or a list of them."""
    items = value.value if isinstance(value, yaml.SequenceNode) else [value]
    for item in items:
        if not isinstance(item, yaml.MappingNode):
            raise _refused(
                "a merge key (<<) takes a mapping or a list of mappings (`<<: *anchor`), "
                f"not a {item.id}",
                item.start_mark,
            )
    return items


class StrictDumper(yaml.SafeDumper):
    """SafeDumper that quotes every string StrictLoader would read as something else (`1e5` is
    a float to it, not to YAML 1.1), so dumped configs load back equal."""


for _cls in (StrictLoader, StrictDumper):
    _cls.add_implicit_resolver("tag:yaml.org,2002:float", _FLOAT_WITHOUT_DOT, list("-+0123456789"))
StrictLoader.add_constructor("tag:yaml.org,2002:timestamp", yaml.SafeLoader.construct_yaml_str)


def parse_yaml(text: str, source: str) -> Any:
    """Parse one YAML document and check its size (check_size); `source` names it in error
    messages (a file path or an override)."""
    try:
        data = yaml.load(text, Loader=StrictLoader)
    except yaml.MarkedYAMLError as error:  # file:line:column: problem
        mark = error.problem_mark or error.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = error.problem or error.context or "syntax error"
        raise ConfigError(f"{where}: invalid YAML: {problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(f"{source}: invalid YAML: {error}") from None
    except RecursionError:
        raise ConfigError(f"{source}: values nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as error:  # an integer of more digits than Python converts, for one
        reason = str(error).split(";")[0]  # Python's advice to programmers follows the ';'
        raise ConfigError(f"{source}: invalid value: {reason}") from None
    check_size(data, source)
    return unshared(data)


def unshared(data: Any) -> Any:
    """A copy of parsed YAML in which every alias use (and every merged value) is a value of its
    own, so that an override of one use leaves the others as they were. Called after
    check_size, which bounds the copy."""
    if isinstance(data, dict):
        return {key: unshared(value) for key, value in data.items()}
    if isinstance(data, list):
        return [unshared(value) for value in data]
    return data


def read_yaml_file(path: Path) -> Any:
    """Read and parse a YAML file; anything but a readable regular UTF-8 file of at most
    MAX_FILE_BYTES (a directory, a device, a FIFO, a huge file) is a ConfigError."""
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except OSError as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"config path is a directory, not a file: {path}")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"config path is not a regular file (a device, FIFO or socket): {path}")
    if info.st_size > MAX_FILE_BYTES:
        raise ConfigError(
            f"config file {path} has {info.st_size:,} bytes, more than the {MAX_FILE_BYTES:,} "
            "a config may have"
        )
    try:
        with open(path, "rb") as handle:
            text = handle.read(MAX_FILE_BYTES + 1).decode("utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read config file {path}: {error}") from None
    if len(text) > MAX_FILE_BYTES:  # it grew after the stat
        raise ConfigError(f"config file {path} has more than {MAX_FILE_BYTES:,} bytes")
    return parse_yaml(text, str(path))


# -------- 1. `defaults:` inheritance --------------------------------------------------------------


DEFAULTS_KEY = "defaults"


def load_with_defaults(path: str | Path) -> dict[str, Any]:
    """Load a YAML config file and everything it inherits, merged into one plain dict."""
    return _Inheritance().load(Path(path), chain=())


def deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    """Return a new dict: `override` merged into `base`, recursing where both sides are dicts."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


class _Inheritance:
    """One load_with_defaults call: each file is read and merged with its parents once (a file
    listed again, as in a diamond of includes, reuses that result), and at most
    MAX_DEFAULTS_LOADS files are loaded in all."""

    def __init__(self) -> None:
        self.loads = 0
        self.done: dict[Path, dict[str, Any]] = {}

    def load(self, path: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
        """Load `path` with its defaults; `chain` is the stack of files that led here."""
        resolved = path.resolve()
        if resolved in chain:
            cycle = " -> ".join(p.name for p in (*chain[chain.index(resolved) :], resolved))
            raise ConfigError(f"circular `defaults:` inheritance: {cycle}")
        self.loads += 1
        if self.loads > MAX_DEFAULTS_LOADS:
            raise ConfigError(
                f"{path}: `defaults:` loaded more than {MAX_DEFAULTS_LOADS} files (counting a "
                "file each time it is listed); flatten the inheritance"
            )
        if resolved not in self.done:
            self.done[resolved] = self._merged(path, resolved, chain)
        return self.done[resolved]

    def _merged(self, path: Path, resolved: Path, chain: tuple[Path, ...]) -> dict[str, Any]:
        """The file's content merged on top of its parents (loaded in order)."""
        content = read_yaml_file(path)
        if content is None:
            return {}
        if not isinstance(content, dict):
            kind = type(content).__name__
            raise ConfigError(f"{path}: a config file must be a mapping of keys, got a {kind}")
        _check_defaults_spelling(content, path)
        merged: dict[str, Any] = {}
        for parent in _parents(content.pop(DEFAULTS_KEY, None), path):
            merged = deep_merge(merged, self.load(parent, (*chain, resolved)))
        return deep_merge(merged, with_paths_from(content, path.parent))


def _check_defaults_spelling(content: dict[str, Any], path: Path) -> None:
    """ConfigError for a top-level key that misspells `defaults:` (a key of the file, not of
    the schema, so validation could only list the schema's keys)."""
    sections = keys_at(DistillationConfig, ())
    for key in content:
        unknown = isinstance(key, str) and key != DEFAULTS_KEY and key not in sections
        if unknown and closest_key(key, [DEFAULTS_KEY]):
            raise ConfigError(
                f"{path}: {key}: unknown key; did you mean '{DEFAULTS_KEY}'? (the file or files "
                "this config extends)"
            )


def _parents(entry: Any, path: Path) -> list[Path]:
    """The files listed under `defaults:` in `path`, resolved relative to its directory."""
    entries = [] if entry is None else entry if isinstance(entry, list) else [entry]
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


# -------- 1. paths relative to the file that writes them -----------------------------------------


FILE_KEYS = ("train_path", "val_path", "prompt_file", "system_prompt_file")
"""Keys of `data` that name a file the run reads: a relative one is relative to the config file."""
PATH_OR_NAME_KEYS = ("dataset_name", "val_dataset_name")
"""Keys of `data` that name a local path or something else (a hub dataset, "tiny_math"): a
relative one is relative to the config file when that path exists there, and left as it is
otherwise."""
MODEL_SECTIONS = ("policy", "teacher")
"""Sections holding tokenizer.chat_template (a template file or the template text), besides
each entry of `teachers`."""


def with_paths_from(content: dict[str, Any], folder: Path) -> dict[str, Any]:
    """One config file's own content with its relative paths (FILE_KEYS, PATH_OR_NAME_KEYS,
    MODEL_SECTIONS) resolved against `folder`, the file's directory, so a recipe finds its files
    from any working directory. Absolute paths, `${...}` interpolations and anything but text
    are left as they are; so are values given on the command line (the working directory's)."""
    teachers = content.get("teachers")
    models = [content.get(name) for name in MODEL_SECTIONS]
    models += list(teachers.values()) if isinstance(teachers, dict) else []
    data = content.get("data")
    places = [(data, key, key in PATH_OR_NAME_KEYS) for key in (*FILE_KEYS, *PATH_OR_NAME_KEYS)]
    places += [(_get(model, "tokenizer"), "chat_template", True) for model in models]
    for section, key, must_exist in places:
        value = _get(section, key)
        if isinstance(value, str) and _is_relative_path(value):
            path = folder / value
            if not must_exist or _exists(path):
                section[key] = os.path.abspath(path)
    return content


def _get(section: Any, key: str) -> Any:
    """section[key] when `section` is a mapping that has `key`, else None."""
    return section.get(key) if isinstance(section, dict) else None


def _exists(path: Path) -> bool:
    """Whether `path` names something; False, not an error, for a name no file can have (a NUL
    byte, a part too long): such a value is a name, not a path."""
    try:
        return path.exists()
    except (OSError, ValueError):
        return False


def _is_relative_path(value: str) -> bool:
    """Whether a config value reads as a relative path: not empty, absolute, a `${...}`
    interpolation, the mandatory mark `???`, a home-relative `~` path, nor anything a path
    cannot be (a multi-line template, a value too long for a file name)."""
    if not value or value == MISSING or value.startswith(("/", "${", "~")) or "\n" in value:
        return False
    return len(value) < 4096 and not Path(value).is_absolute()


# -------- 4. validation ---------------------------------------------------------------------------


def validate_config(
    data: Mapping[str, Any], interpolations: Mapping[str, str] | None = None
) -> DistillationConfig:
    """A DistillationConfig from a plain (already resolved) dict, or ConfigError listing every
    problem, one per line, each naming its full key path (and, from `interpolations`, the
    `${...}` expression its value came from)."""
    teachers = data.get("teachers")
    if isinstance(teachers, dict) and len(teachers) > MAX_TEACHERS:
        raise ConfigError(
            f"teachers: {len(teachers):,} teachers, more than the {MAX_TEACHERS} a run routes "
            "between (each starts workers of its own)"
        )
    try:
        cfg = DistillationConfig.model_validate(dict(data))
    except ValidationError as error:
        problems = describe_validation_error(error, interpolations or {})
    else:
        problems = find_problems(cfg)  # the cross-field rules, once every field is valid
    if problems:
        raise ConfigError(format_problems(problems) + _converter_note(problems))
    return cfg


def format_problems(problems: list[str]) -> str:
    """One problem as is; several under a header, one per line, the first MAX_PROBLEMS_SHOWN
    of them and then their count."""
    if len(problems) == 1:
        return problems[0]
    shown = [f"  {problem}" for problem in problems[:MAX_PROBLEMS_SHOWN]]
    if len(problems) > MAX_PROBLEMS_SHOWN:
        shown.append(f"  ... and {len(problems) - MAX_PROBLEMS_SHOWN:,} more")
    return f"invalid configuration ({len(problems):,} problems):\n" + "\n".join(shown)


def describe_validation_error(
    error: ValidationError, interpolations: Mapping[str, str]
) -> list[str]:
    """One human line per pydantic error."""
    problems: list[str] = []
    for item in error.errors(include_url=False):
        loc = tuple(item["loc"])
        path = join_path(loc)
        origin = interpolations.get(path)
        source = f" (from {show_path(origin, limit=120)})" if origin else ""
        problems.append(f"{show_path(path)}: {_explain(item, loc)}{source}")
    return problems


def _converter_note(problems: list[str]) -> str:
    """A last line pointing to the converter when several problems are NeMo-RL's keys (a
    NeMo-RL config, not one key written from habit)."""
    count = sum(any(mark in problem for mark in NEMO_RL_MARKS) for problem in problems)
    if count < 2:
        return ""
    return (
        f"\n{count:,} keys are NeMo-RL's: `{CONVERTER}` converts a NeMo-RL config and prints "
        "what each key became (docs/nemo_rl.md)"
    )


NEMO_RL_MARKS = ("NeMo-RL's key", "NeMo-RL's form of the key")
"""How unknown_key_hint's messages begin."""


def _explain(item: Mapping[str, Any], loc: tuple[str | int, ...]) -> str:
    """What is wrong at `loc` and what is allowed, in words."""
    kind, value, nemo_rl = item["type"], item.get("input"), unknown_key_hint(loc)
    if kind == "extra_forbidden":
        return _unknown_key(loc, nemo_rl)
    if kind == "missing":
        return "required key is missing"
    nemo_rl = f"; {nemo_rl}" if nemo_rl else ""
    if kind in ("model_type", "model_attributes_type", "dict_type"):
        return f"must be a section (a mapping of keys); got {_shown(value)}{nemo_rl}"
    message = re.sub(r"^(Input|String|Value|List|Tuple) should ", "must ", item["msg"])
    message = message.removeprefix("Value error, ").replace(", got a ", ", not a ")
    hint = ""
    if kind == "literal_error" and isinstance(value, str):
        choices = re.findall(r"'([^']*)'", item.get("ctx", {}).get("expected", ""))
        match = closest(value, choices)
        hint = f" (did you mean '{match}'?)" if match else ""
    return f"{message}; got {_shown(value)}{hint}{nemo_rl}"


def _shown(value: Any) -> str:
    """A wrong value as a message echoes it: a string without what may be a URL's user-info
    (a malformed URL has no scheme for the command line's redaction to see)."""
    return show(redact_user_info(value) if isinstance(value, str) else value)


def _unknown_key(loc: tuple[str | int, ...], nemo_rl: str | None) -> str:
    """Message for a key the section does not accept: what it is here when NeMo-RL has it
    (`nemo_rl`), else the closest valid key of the same meaning, else the valid keys."""
    if nemo_rl:
        return f"unknown key; {nemo_rl}"
    valid = keys_at(DistillationConfig, loc[:-1])
    hint = suggest(str(loc[-1]), valid)
    if hint:
        return f"unknown key{hint}"
    return f"unknown key; valid keys here: {', '.join(valid)}"


# -------- back to plain data and YAML -------------------------------------------------------------


def to_dict(cfg: BaseModel) -> dict[str, Any]:
    """The config (or any section) as plain JSON-compatible data, every default filled in."""
    return cfg.model_dump(mode="json")


def to_yaml(cfg: BaseModel) -> str:
    """The config (or any section) as YAML that load_config reads back to an equal config."""
    return yaml.dump(
        to_dict(cfg), Dumper=StrictDumper, sort_keys=False, default_flow_style=False, width=100
    )
