"""Prompt datasets: the embedded tiny_math task, local jsonl/json/parquet files, or a hub dataset
through `datasets`, returned as records {"prompt": str, "answer": str} (and "response",
"teacher" when the run uses them)."""

import io
import json
from collections.abc import Collection, Iterable
from numbers import Number
from pathlib import Path
from typing import Literal

from nemo_opd.config import DataConfig
from nemo_opd.data.user_files import read_user_file, read_utf8
from nemo_opd.errors import SetupError

Split = Literal["train", "validation"]
Rows = Iterable[tuple[str, object]]
"""Rows with where each is in its source ("line 42" of a JSONL file, "item 3", "row 7")."""
VALIDATION_SPLITS = ("validation", "test")
TINY_MATH_VAL_SPLITS = (None, "validation", "development")
NON_EMPTY = ("prompt", "answer")
"""Fields that must hold more than whitespace: an empty prompt is a chat with an empty user
turn, an empty answer one no response can match."""


def load_prompt_records(
    cfg: DataConfig,
    split: Split,
    *,
    responses: bool = False,
    teachers: Collection[str] | None = None,
) -> list[dict]:
    """The records of one split, with the configured prompt and answer columns renamed to
    "prompt" and "answer" (answers as strings); with `responses` (a run that trains on the
    dataset's responses) data.response_key's column as "response"; with `teachers` (the names
    of several teachers) the name of each record's teacher as "teacher", read from
    data.teacher_key through data.teacher_routes. A column nothing reads is not required.
    Raises SetupError for a missing file, missing columns, an empty dataset, or a record routed
    to no teacher."""
    rows, where = _load_rows(cfg, split)
    rows = list(rows)
    keys = {
        "prompt": (cfg.prompt_key, "data.prompt_key"),
        "answer": (cfg.answer_key, "data.answer_key"),
    }
    if responses:
        if cfg.response_key is None:
            raise SetupError("the run trains on the dataset's responses: set data.response_key")
        keys["response"] = (cfg.response_key, "data.response_key")
    if teachers is not None:
        keys["teacher"] = (cfg.teacher_key, "data.teacher_key")
    records = _select_columns(rows, keys, where)
    if not records:
        raise SetupError(f"{where} has no rows: nothing to train or validate on")
    if teachers is not None:
        _route(records, [position for position, _ in rows], cfg, set(teachers), where)
    return records


def _route(
    records: list[dict], positions: list[str], cfg: DataConfig, teachers: set[str], where: str
) -> None:
    """Replace each record's data.teacher_key value by its teacher's name (through
    data.teacher_routes when set); SetupError at the first record routed to no teacher."""
    routes = cfg.teacher_routes
    for record, position in zip(records, positions, strict=True):
        value = record["teacher"]
        name = routes.get(value) if routes is not None else value
        if name in teachers:
            record["teacher"] = name
            continue
        if routes is not None:
            known = f"data.teacher_routes has {sorted(routes)}"
            fix = f"add data.teacher_routes.{value}=<teacher>"
        else:
            known = f"the teachers are {sorted(teachers)}"
            fix = "name a teacher there, or map values to teachers with data.teacher_routes"
        raise SetupError(
            f"{where}: {position}: {cfg.teacher_key!r} (data.teacher_key) is {value!r}, which "
            f"routes to no teacher ({known}); {fix}"
        )


def _load_rows(cfg: DataConfig, split: Split) -> tuple[Rows, str]:
    """Rows of the configured source for the split, and a description of that source."""
    path = cfg.train_path if split == "train" else cfg.val_path
    if path is not None:
        key = "data.train_path" if split == "train" else "data.val_path"
        return _load_local(path, key), f"{key} ({path})"
    key, name = "data.dataset_name", cfg.dataset_name
    if split == "validation" and cfg.val_dataset_name is not None:
        key, name = "data.val_dataset_name", cfg.val_dataset_name
    if name == "tiny_math":
        return _tiny_math_rows(split, cfg.val_split)
    if name is None:
        if split == "train":
            raise SetupError("no train data: set data.dataset_name or data.train_path")
        raise SetupError(
            "no validation data: set data.val_path or data.val_dataset_name, or validate not at "
            "all (distillation.val_period 0, val_at_start and val_at_end false)"
        )
    if _saved_to_disk(name):
        return _load_saved(name, split, cfg.val_split, key), f"{key} ({name}, {split})"
    return _load_hub(name, split, cfg.val_split), f"dataset {name!r} ({split})"


def _tiny_math_rows(split: Split, val_split: str | None) -> tuple[Rows, str]:
    """The embedded task's rows. data.val_split "development" is the tuning setup: validation on
    the development split, training on train without its problems (nemo_opd/tiny/task.py);
    null or "validation" is the held-out split and the whole train split."""
    from nemo_opd.tiny.task import load_tiny_math

    if val_split not in TINY_MATH_VAL_SPLITS:
        raise SetupError(
            f"data.val_split is {val_split!r}, but tiny_math validates on 'validation' (the 500 "
            "held-out problems, the default) or 'development' (for tuning: it also trains on "
            "train without the development problems)"
        )
    name = split
    if val_split == "development":
        name = "development_train" if split == "train" else "development"
    return _numbered_rows(load_tiny_math(name)), f"tiny_math ({name})"


def _load_local(path: str, key: str) -> Rows:
    """Rows of a local .jsonl/.json/.parquet file (read directly: no dataset cache)."""
    reader = LOCAL_READERS.get(Path(path).suffix.lower())
    if reader is None:
        raise SetupError(
            f"{key}: {Path(path).name} has an unsupported extension; use one of "
            f"{', '.join(LOCAL_READERS)}"
        )
    return read_user_file(path, key, reader)


def _read_jsonl(file: Path) -> Rows:
    return _jsonl_rows(read_utf8(file))


def _jsonl_rows(text: str) -> Rows:
    """One row per non-blank line, numbered by the file's 1-based line."""
    rows = []
    # Lines end at \n, \r\n or \r only (not str.splitlines' U+2028 and kin, valid in JSON);
    # the newline is cut so that json's column is the column in the file.
    for number, line in enumerate(io.StringIO(text, newline=None), start=1):
        if line.strip():
            try:
                rows.append((f"line {number}", json.loads(line.rstrip("\n"))))
            except json.JSONDecodeError as error:
                raise ValueError(
                    f"line {number} is not valid JSON ({error.msg} at column {error.colno}); "
                    "each line must hold one JSON object"
                ) from None
    return rows


_JSON_SHAPES = "a .json file must hold a list of objects, or one object per line"


def _read_json(file: Path) -> Rows:
    """A JSON list of rows, or JSON lines saved with a .json name."""
    text = read_utf8(file)
    try:
        rows = json.loads(text)
    except json.JSONDecodeError as error:
        if not text.lstrip().startswith("["):
            return _jsonl_rows(text)
        raise ValueError(
            f"line {error.lineno} is not valid JSON ({error.msg} at column {error.colno}); "
            f"{_JSON_SHAPES}"
        ) from None
    if not isinstance(rows, list):
        raise ValueError(f"found {_kind(rows)}; {_JSON_SHAPES}")
    return [(f"item {number}", row) for number, row in enumerate(rows, start=1)]


def _read_parquet(file: Path) -> Rows:
    import pyarrow.parquet as pq

    return _numbered_rows(pq.read_table(file).to_pylist())


LOCAL_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def _load_hub(name: str, split: Split, val_split: str | None) -> Rows:
    """Rows of a hub dataset (or a local dataset directory); validation tries val_split, else
    "validation" then "test"."""
    import datasets

    if split == "train":
        candidates = ["train"]
    else:
        candidates = [val_split] if val_split else list(VALIDATION_SPLITS)
    try:
        available = datasets.get_dataset_split_names(name)
    except Exception as error:  # noqa: BLE001 - network, auth or a wrong name
        raise SetupError(
            f"data.dataset_name: could not open dataset {name!r}: {error}. Check the name, the "
            "network, or point data.train_path / data.val_path at local files"
        ) from error
    for candidate in candidates:
        if candidate in available:
            return _numbered_rows(datasets.load_dataset(name, split=candidate))
    raise SetupError(
        f"dataset {name!r} has no split {' or '.join(map(repr, candidates))} "
        f"(it has {', '.join(available)}); set data.val_split"
    )


def _saved_to_disk(name: str) -> bool:
    """Whether `name` is a directory written by Dataset.save_to_disk or DatasetDict's (which
    datasets.load_dataset refuses)."""
    path = Path(name)
    try:
        return (path / "state.json").is_file() or (path / "dataset_dict.json").is_file()
    except OSError:  # a name no file can have (a part too long): a hub name, or nothing
        return False


def _load_saved(name: str, split: Split, val_split: str | None, key: str) -> Rows:
    """Rows of a save_to_disk directory: a DatasetDict's split (as _load_hub picks it), or a
    single Dataset, which is the data of the key naming it: data.dataset_name's is the
    training data (so validation needs data.val_dataset_name or data.val_path),
    data.val_dataset_name's the validation data."""
    import datasets

    try:
        saved = datasets.load_from_disk(name)
    except Exception as error:  # noqa: BLE001 - a damaged or partial directory
        raise SetupError(
            f"{key}: could not load {name} (saved with save_to_disk): {error}"
        ) from error
    if isinstance(saved, datasets.Dataset):
        if split == "validation" and key == "data.dataset_name":
            raise SetupError(
                f"{key}: {name} is a single Dataset saved with save_to_disk, without splits: it "
                "is the training data; name the validation data with data.val_dataset_name or "
                "data.val_path, or save a DatasetDict with a 'validation' split"
            )
        return _numbered_rows(saved)
    candidates = ["train"] if split == "train" else [val_split] if val_split else VALIDATION_SPLITS
    for candidate in candidates:
        if candidate in saved:
            return _numbered_rows(saved[candidate])
    fix = "save it with a 'train' split" if split == "train" else "set data.val_split"
    raise SetupError(
        f"{key}: {name} has no split {' or '.join(map(repr, candidates))} (it has "
        f"{', '.join(saved)}); {fix}"
    )


def _numbered_rows(rows: Iterable[object]) -> Rows:
    return ((f"row {number}", row) for number, row in enumerate(rows, start=1))


def _select_columns(rows: Rows, keys: dict[str, tuple[str, str]], where: str) -> list[dict]:
    """[{name: text}] from each row, for keys {name: (column, config key)} ("prompt", "answer"
    and maybe "response" and "teacher"). A prompt column holding chat messages also gives
    "messages" (chat_messages; "prompt" is then its last user message). A row that is not an
    object, or whose column is missing, null or neither text nor a number, is refused, and so
    is an empty (or blank) prompt or answer."""
    fields = " and ".join(f"{key!r} ({config_key})" for key, config_key in keys.values())
    records = []
    for position, row in rows:
        if not isinstance(row, dict):
            raise SetupError(
                f"{where}: {position} is {_kind(row)}, not an object: every row must be an "
                f"object holding the fields {fields}"
            )
        record = {}
        for name, (key, config_key) in keys.items():
            if key not in row:
                raise SetupError(
                    f"{where}: {position} has no column {key!r} ({config_key}); columns: "
                    f"{', '.join(sorted(row))}. Set {config_key} or fix the row"
                )
            value = row[key]
            if name == "prompt" and isinstance(value, list):  # chat-format messages
                record["messages"] = chat_messages(value, f"{where}: {position}: {key!r}")
                record[name] = record["messages"][-1]["content"]
                continue
            if not isinstance(value, str | Number):
                raise SetupError(
                    f"{where}: {position}: {key!r} ({config_key}) is {_kind(value)}; the {name} "
                    "must be text or a number: fix or remove the row"
                )
            if name in NON_EMPTY and not str(value).strip():
                raise SetupError(
                    f"{where}: {position}: {key!r} ({config_key}) is empty; the {name} must "
                    "hold text: fix or remove the row"
                )
            record[name] = str(value)
        records.append(record)
    return records


def chat_messages(value: list, where: str) -> list[dict]:
    """A prompt given as chat messages ([{"role", "content"}], the last a user message, roles
    system or user), as plain {"role", "content"} dicts; SetupError otherwise. Assistant
    turns are refused: in a message log they would read as the student's own, trained on."""
    roles = ("system", "user")
    messages = []
    for message in value:
        if not (
            isinstance(message, dict)
            and message.get("role") in roles
            and isinstance(message.get("content"), str)
        ):
            raise SetupError(
                f"{where}: a chat-format prompt is a list of {{role, content}} messages with "
                f"roles {', '.join(roles)} and text content; one is {str(message)[:60]!r}"
            )
        messages.append({"role": message["role"], "content": message["content"]})
    if not messages or messages[-1]["role"] != "user":
        raise SetupError(f"{where}: a chat-format prompt must end with a user message")
    return messages


def _kind(value: object) -> str:
    """What a value read from a dataset is, in words ("a list", "null")."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, Number):
        return f"a number ({value})"
    kinds = {dict: "an object", list: "a list", str: "a string"}
    return next(
        (k for t, k in kinds.items() if isinstance(value, t)), f"a {type(value).__name__} value"
    )
