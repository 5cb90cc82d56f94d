import json
import re

import pytest

from nemo_opd.config import DataConfig
from nemo_opd.data.datasets import load_prompt_records
from nemo_opd.errors import SetupError
from nemo_opd.tiny.task import TinyMathConfig, generate_problems


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


def test_tiny_math_development_setup_never_reads_held_out():
    tuning = DataConfig(dataset_name="tiny_math", prompt_key="prompt", val_split="development")
    held_out = load_prompt_records(
        DataConfig(dataset_name="tiny_math", prompt_key="prompt"), "validation"
    )
    dev = load_prompt_records(tuning, "validation")
    train = load_prompt_records(tuning, "train")
    assert len(dev) == 500
    prompts = {r["prompt"] for r in held_out}
    assert not prompts & {r["prompt"] for r in dev}
    assert not prompts & {r["prompt"] for r in train}
    assert not {r["prompt"] for r in dev} & {r["prompt"] for r in train}
    with pytest.raises(SetupError, match="'development'"):
        load_prompt_records(DataConfig(dataset_name="tiny_math", val_split="test"), "validation")


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


def test_responses_are_read_only_when_the_run_trains_on_them(tmp_path):
    rows = [
        {"problem": "p", "answer": "1", "worked": "p = 1. \\boxed{1}"},
        {"problem": "q", "answer": 2},
    ]
    cfg = DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", rows), response_key="worked")
    assert load_prompt_records(cfg, "train")[1] == {"prompt": "q", "answer": "2"}
    with pytest.raises(SetupError, match=r"line 2 has no column 'worked' \(data.response_key\)"):
        load_prompt_records(cfg, "train", responses=True)
    records = load_prompt_records(
        cfg.model_copy(update={"train_path": _jsonl(tmp_path / "u.jsonl", rows[:1])}),
        "train",
        responses=True,
    )
    assert records == [{"prompt": "p", "answer": "1", "response": "p = 1. \\boxed{1}"}]
    with pytest.raises(SetupError, match="set data.response_key"):
        load_prompt_records(DataConfig(dataset_name="tiny_math"), "train", responses=True)


def test_each_record_names_its_teacher_directly_or_through_routes(tmp_path):
    rows = [
        {"problem": "p", "answer": 1, "source": "algebra"},
        {"problem": "q", "answer": 2, "source": "geometry"},
    ]
    cfg = DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", rows), teacher_key="source")
    assert "teacher" not in load_prompt_records(cfg, "train")[0]  # read only when routed
    records = load_prompt_records(cfg, "train", teachers=["algebra", "geometry"])
    assert [r["teacher"] for r in records] == ["algebra", "geometry"]
    shared = cfg.model_copy(update={"teacher_routes": {"algebra": "big", "geometry": "big"}})
    assert [r["teacher"] for r in load_prompt_records(shared, "train", teachers=["big"])] == [
        "big",
        "big",
    ]


def test_a_record_routed_to_no_teacher_is_refused_with_its_line(tmp_path):
    rows = [{"problem": "p", "answer": 1, "source": "geometry"}, {"problem": "q", "answer": 2}]
    cfg = DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", rows), teacher_key="source")
    with pytest.raises(SetupError, match=r"line 2 has no column 'source' \(data.teacher_key\)"):
        load_prompt_records(cfg, "train", teachers=["geometry"])
    rows[1]["source"] = "algebra"
    cfg = DataConfig(train_path=_jsonl(tmp_path / "u.jsonl", rows), teacher_key="source")
    with pytest.raises(SetupError, match=r"line 2: 'source' \(data.teacher_key\) is 'algebra', wh"):
        load_prompt_records(cfg, "train", teachers=["geometry"])
    routes = cfg.model_copy(update={"teacher_routes": {"geometry": "geometry"}})
    with pytest.raises(SetupError, match=r"add data.teacher_routes.algebra=<teacher>"):
        load_prompt_records(routes, "train", teachers=["geometry"])


def test_tiny_math_routes_by_operation():
    cfg = DataConfig(dataset_name="tiny_math", prompt_key="prompt", teacher_key="operation")
    routes = {"addition": "sums", "subtraction": "sums", "multiplication": "products"}
    routed = cfg.model_copy(update={"teacher_routes": routes})
    records = load_prompt_records(routed, "validation", teachers=["sums", "products"])
    problems = generate_problems(TinyMathConfig())["validation"]
    assert [r["teacher"] for r in records] == [
        "products" if p.op == "*" else "sums" for p in problems
    ]


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


def _refusal(path) -> str:
    """The SetupError message of loading the file at path as the train split."""
    with pytest.raises(SetupError) as raised:
        load_prompt_records(DataConfig(train_path=str(path)), "train")
    return str(raised.value)


@pytest.mark.parametrize(
    ("line", "kind"),
    [
        ("[1, 2, 3]", "a list"),
        ("NaN", "a number (nan)"),
        ('"text"', "a string"),
        ("7", "a number (7)"),
    ],
)
def test_jsonl_row_that_is_not_an_object_names_its_line(tmp_path, line, kind):
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"problem": "p", "answer": "1"}) + "\n\n" + line + "\n")
    assert _refusal(path) == (
        f"data.train_path ({path}): line 3 is {kind}, not an object: every row must be an object "
        "holding the fields 'problem' (data.prompt_key) and 'answer' (data.answer_key)"
    )


def test_json_list_item_that_is_not_an_object_names_its_item(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps([{"problem": "p", "answer": "1"}, [1, 2]]))
    assert re.search(r"t.json\): item 2 is a list, not an object", _refusal(path))


def test_json_that_is_not_a_list(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"rows": []}))
    assert re.search("found an object; a .json file must hold a list", _refusal(path))


def test_malformed_jsonl_line_is_named_by_its_line_in_the_file(tmp_path):
    path = tmp_path / "t.jsonl"
    good = json.dumps({"problem": "p", "answer": "1"}) + "\n"
    path.write_text(good * 40 + "\n" + '{"problem": "p" "answer": "1"}\n' + good)
    assert _refusal(path) == (
        f"data.train_path: could not read {path}: line 42 is not valid JSON (Expecting ',' "
        "delimiter at column 17); each line must hold one JSON object"
    )


def test_malformed_json_list_is_named_by_its_line(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('[\n  {"problem": "p", "answer": "1"},\n  {"problem": "p",}\n]\n')
    assert re.search(r"line 3 is not valid JSON \(.* at column 19\)", _refusal(path))


@pytest.mark.parametrize("suffix", [".jsonl", ".json"])
def test_data_file_that_is_not_utf8(tmp_path, suffix):
    path = tmp_path / f"t{suffix}"
    path.write_bytes(b'{"problem": "p", "answer": "1"}\n{"problem": "caf\xe9", "answer": "1"}\n')
    assert _refusal(path) == (
        f"data.train_path: could not read {path}: line 2 is not UTF-8 text (byte 0xe9): save the "
        "file as UTF-8"
    )


@pytest.mark.parametrize(
    ("row", "refusal"),
    [
        ({"problem": None, "answer": "1"}, "'problem' (data.prompt_key) is null"),
        ({"problem": "p", "answer": None}, "'answer' (data.answer_key) is null"),
        ({"problem": "p", "answer": [1, 2]}, "'answer' (data.answer_key) is a list"),
        ({"problem": {"text": "p"}, "answer": "1"}, "'problem' (data.prompt_key) is an object"),
    ],
)
def test_null_or_structured_prompt_or_answer_is_refused(tmp_path, row, refusal):
    path = _jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": 1}, row])
    kind = "prompt" if "prompt_key" in refusal else "answer"
    assert _refusal(path) == (
        f"data.train_path ({path}): line 2: {refusal}; the {kind} must be text or a number: fix "
        "or remove the row"
    )


@pytest.mark.parametrize(
    ("row", "key"),
    [
        ({"problem": "", "answer": "1"}, "'problem' (data.prompt_key)"),
        ({"problem": " \n\t", "answer": "1"}, "'problem' (data.prompt_key)"),
        ({"problem": "p", "answer": ""}, "'answer' (data.answer_key)"),
    ],
)
def test_empty_prompt_or_answer_is_refused(tmp_path, row, key):
    # An empty problem would be rendered as a chat with an empty user turn, silently.
    path = _jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": 1}, row])
    kind = "prompt" if "prompt_key" in key else "answer"
    assert _refusal(path) == (
        f"data.train_path ({path}): line 2: {key} is empty; the {kind} must hold text: fix or "
        "remove the row"
    )


def test_missing_answer_names_the_line(tmp_path):
    path = _jsonl(tmp_path / "t.jsonl", [{"problem": "p", "answer": 1}, {"problem": "p"}])
    assert re.search(r"line 2 has no column 'answer' \(data.answer_key\)", _refusal(path))


def test_parquet_null_answer_names_the_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "t.parquet"
    pq.write_table(pa.table({"problem": ["a", "b"], "answer": [1.5, None]}), path)
    assert re.search(r"row 2: 'answer' \(data.answer_key\) is null", _refusal(path))


def test_numbers_become_text(tmp_path):
    rows = [{"problem": 12, "answer": 42}, {"problem": "p", "answer": 0.5}]
    records = load_prompt_records(
        DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", rows)), "train"
    )
    assert records == [{"prompt": "12", "answer": "42"}, {"prompt": "p", "answer": "0.5"}]


def test_a_prompt_column_of_chat_messages(tmp_path):
    """A prompt column holding chat messages: the opening as written (its system message, its
    user turns), rendered by the chat template; the last user message is the prompt's text."""
    from transformers import AutoTokenizer

    from nemo_opd.algorithms.prompts import encode_prompts
    from nemo_opd.data.chat import ChatFormatter
    from nemo_opd.tiny import resolve_pretrained

    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}]
    rows = [{"messages": chat, "answer": 4}, {"messages": "3 + 3?", "answer": 6}]
    cfg = DataConfig(train_path=_jsonl(tmp_path / "t.jsonl", rows), prompt_key="messages")
    records = load_prompt_records(cfg, "train")
    assert records[0] == {"prompt": "2 + 2?", "answer": "4", "messages": chat}
    assert records[1] == {"prompt": "3 + 3?", "answer": "6"}
    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer"))
    formatter = ChatFormatter(tokenizer, system_prompt="Ignored: the row has its own.")
    samples = encode_prompts(records, formatter, 256, "train").samples
    text = tokenizer.decode([i for m in samples[0]["message_log"] for i in m["token_ids"]])
    expected = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    assert text == expected
    assert [m["role"] for m in samples[0]["message_log"]] == ["system", "user"]
    for bad in ([{"role": "assistant", "content": "4"}], [], [{"role": "user", "content": 4}]):
        rows = [{"messages": [*chat, *bad] if bad else bad, "answer": 1}]
        cfg = DataConfig(train_path=_jsonl(tmp_path / "b.jsonl", rows), prompt_key="messages")
        with pytest.raises(SetupError, match="chat-format prompt"):
            load_prompt_records(cfg, "train")


def _saved_rows(prefix: str, count: int) -> list[dict]:
    return [{"problem": f"{prefix} {i}", "answer": i} for i in range(count)]


def test_a_dataset_saved_with_save_to_disk(tmp_path):
    # datasets.load_dataset refuses a save_to_disk directory (it wants load_from_disk): a
    # single Dataset is the data of the key that names it, a DatasetDict has splits.
    import datasets

    single = tmp_path / "single"
    datasets.Dataset.from_list(_saved_rows("train", 4)).save_to_disk(single)
    held_out = tmp_path / "held_out"
    datasets.Dataset.from_list(_saved_rows("val", 2)).save_to_disk(held_out)
    cfg = DataConfig(dataset_name=str(single), val_dataset_name=str(held_out))
    assert [r["prompt"] for r in load_prompt_records(cfg, "train")] == [
        f"train {i}" for i in range(4)
    ]
    assert [r["answer"] for r in load_prompt_records(cfg, "validation")] == ["0", "1"]

    splits = tmp_path / "splits"
    whole = {"train": _saved_rows("train", 3), "test": _saved_rows("test", 2)}
    datasets.DatasetDict({k: datasets.Dataset.from_list(v) for k, v in whole.items()}).save_to_disk(
        splits
    )
    cfg = DataConfig(dataset_name=str(splits))
    assert len(load_prompt_records(cfg, "train")) == 3
    assert [r["prompt"] for r in load_prompt_records(cfg, "validation")] == ["test 0", "test 1"]


def test_a_single_saved_dataset_is_not_also_the_validation_data(tmp_path):
    import datasets

    single = tmp_path / "single"
    datasets.Dataset.from_list(_saved_rows("train", 4)).save_to_disk(single)
    with pytest.raises(SetupError) as refused:
        load_prompt_records(DataConfig(dataset_name=str(single)), "validation")
    assert str(refused.value) == (
        f"data.dataset_name: {single} is a single Dataset saved with save_to_disk, without "
        "splits: it is the training data; name the validation data with data.val_dataset_name "
        "or data.val_path, or save a DatasetDict with a 'validation' split"
    )
