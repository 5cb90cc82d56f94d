import json

import pytest

from nemo_opd.config import DataConfig
from nemo_opd.data.datasets import load_prompt_records
from nemo_opd.errors import SetupError


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_tiny_math_both_splits():
    cfg = DataConfig(dataset_name="tiny_math", prompt_key="prompt", answer_key="answer")
    train = load_prompt_records(cfg, "train")
    val = load_prompt_records(cfg, "validation")
    assert len(train) > len(val) > 0
    assert set(train[0]) == {"prompt", "answer"}
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in val}


def test_local_jsonl_and_parquet_with_renamed_columns(tmp_path):
    rows = [{"question": f"q{i}", "solution": i} for i in range(5)]
    cfg = DataConfig(
        train_path=_jsonl(tmp_path / "train.jsonl", rows),
        prompt_key="question",
        answer_key="solution",
    )
    records = load_prompt_records(cfg, "train")
    assert records[3] == {"prompt": "q3", "answer": "3"}

    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "val.parquet")
    cfg = cfg.model_copy(update={"val_path": str(tmp_path / "val.parquet")})
    assert load_prompt_records(cfg, "validation") == records


def test_missing_file(tmp_path):
    cfg = DataConfig(train_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(SetupError, match=r"data.train_path: file not found: .*nope.jsonl"):
        load_prompt_records(cfg, "train")


def test_missing_column_names_the_key_and_the_columns(tmp_path):
    cfg = DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", [{"problem": "p", "sol": "1"}]))
    with pytest.raises(
        SetupError,
        match=r"no column 'answer' \(data.answer_key\); columns: "
        r"problem, sol",
    ):
        load_prompt_records(cfg, "train")


def test_empty_dataset(tmp_path):
    empty = tmp_path / "empty.parquet"
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(
        pa.table({"problem": pa.array([], pa.string()), "answer": pa.array([], pa.string())}), empty
    )
    with pytest.raises(SetupError, match="has no rows"):
        load_prompt_records(DataConfig(train_path=str(empty)), "train")


def test_unsupported_extension(tmp_path):
    path = tmp_path / "data.csv"
    path.write_text("problem,answer\n")
    with pytest.raises(SetupError, match="unsupported extension"):
        load_prompt_records(DataConfig(train_path=str(path)), "train")
