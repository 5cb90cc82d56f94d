"""Prompt datasets: the embedded tiny_math task, local jsonl/json/parquet files, or a hub dataset
through `datasets`, returned as records {"prompt": str, "answer": str}."""

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

from nemo_opd.config import DataConfig
from nemo_opd.errors import SetupError

Split = Literal["train", "validation"]
VALIDATION_SPLITS = ("validation", "test")


def load_prompt_records(cfg: DataConfig, split: Split) -> list[dict]:
    """The records of one split, with the configured prompt and answer columns renamed to
    "prompt" and "answer" (answers as strings). Raises SetupError for a missing file, missing
    columns or an empty dataset."""
    rows, where = _load_rows(cfg, split)
    records = _select_columns(rows, cfg.prompt_key, cfg.answer_key, where)
    if not records:
        raise SetupError(f"{where} has no rows: nothing to train or validate on")
    return records


def _load_rows(cfg: DataConfig, split: Split) -> tuple[Iterable[dict], str]:
    """Rows of the configured source for the split, and a description of that source."""
    path = cfg.train_path if split == "train" else cfg.val_path
    if path is not None:
        key = "data.train_path" if split == "train" else "data.val_path"
        return _load_local(path, key), f"{key} ({path})"
    name = cfg.dataset_name if split == "train" else (cfg.val_dataset_name or cfg.dataset_name)
    if name == "tiny_math":
        from nemo_opd.tiny.task import load_tiny_math

        return load_tiny_math(split), f"tiny_math ({split})"
    if name is None:
        path_key = "train_path" if split == "train" else "val_path"
        raise SetupError(f"no {split} data: set data.dataset_name or data.{path_key}")
    return _load_hub(name, split, cfg.val_split), f"dataset {name!r} ({split})"


def _load_local(path: str, key: str) -> list[dict]:
    """Rows of a local .jsonl/.json/.parquet file (read directly: no dataset cache)."""
    file = Path(path)
    if not file.is_file():
        raise SetupError(f"{key}: file not found: {file.resolve()}")
    reader = LOCAL_READERS.get(file.suffix.lower())
    if reader is None:
        raise SetupError(
            f"{key}: {file.name} has an unsupported extension; use one of "
            f"{', '.join(LOCAL_READERS)}"
        )
    try:
        return reader(file)
    except Exception as error:  # noqa: BLE001 - any parse failure is the user's file
        raise SetupError(f"{key}: could not read {file}: {error}") from error


def _read_jsonl(file: Path) -> list[dict]:
    with open(file, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _read_json(file: Path) -> list[dict]:
    """A JSON list of rows, or JSON lines saved with a .json name."""
    text = file.read_text(encoding="utf-8")
    try:
        rows = json.loads(text)
    except json.JSONDecodeError:
        return _read_jsonl(file)
    if not isinstance(rows, list):
        raise ValueError("expected a list of objects")
    return rows


def _read_parquet(file: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(file).to_pylist()


LOCAL_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}


def _load_hub(name: str, split: Split, val_split: str | None) -> Iterable[dict]:
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
            return datasets.load_dataset(name, split=candidate)
    raise SetupError(
        f"dataset {name!r} has no split {' or '.join(map(repr, candidates))} "
        f"(it has {', '.join(available)}); set data.val_split"
    )


def _select_columns(rows: Iterable[dict], prompt_key: str, answer_key: str, where: str) -> list:
    """[{"prompt", "answer"}] from each row; a missing column is named with those present."""
    columns = getattr(rows, "column_names", None)
    records = []
    for index, row in enumerate(rows):
        for field, key in (("prompt_key", prompt_key), ("answer_key", answer_key)):
            if key not in row:
                present = columns or sorted(row)
                raise SetupError(
                    f"{where}: row {index} has no column {key!r} (data.{field}); columns: "
                    f"{', '.join(present)}"
                )
        records.append({"prompt": str(row[prompt_key]), "answer": str(row[answer_key])})
    return records
