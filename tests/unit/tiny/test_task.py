import re

import pytest

import nemo_opd.tiny.task as task
from nemo_opd.tiny.task import (
    OPERATORS,
    TinyMathConfig,
    build_tiny_math_splits,
    generate_development,
    generate_problems,
    load_jsonl,
    load_tiny_math,
    save_jsonl,
)

SOLUTION = re.compile(r"^(\d+) ([+*-]) (\d+) = (\d+)\. \\boxed\{(\d+)\}$")
SMALL = TinyMathConfig(num_train=3000, num_validation=300, seed=7)


def parse(record: dict) -> tuple[int, str, int, int, int]:
    match = SOLUTION.match(record["solution"])
    assert match, record["solution"]
    a, op, b, c, boxed = match.groups()
    return int(a), op, int(b), int(c), int(boxed)


@pytest.fixture(scope="module")
def splits() -> dict[str, list[dict]]:
    return build_tiny_math_splits(SMALL)


def test_sizes_and_fields(splits):
    assert len(splits["train"]) == 3000
    assert len(splits["validation"]) == 300
    for record in splits["train"] + splits["validation"]:
        assert set(record) == {"prompt", "answer", "solution", "operation"}
        assert (
            record["solution"].split()[1]
            == OPERATORS[("addition", "subtraction", "multiplication").index(record["operation"])]
        )


def test_same_seed_same_data_other_seed_other_data(splits):
    assert build_tiny_math_splits(SMALL) == splits
    other = build_tiny_math_splits(TinyMathConfig(num_train=3000, num_validation=300, seed=8))
    assert other["train"] != splits["train"]


def test_every_answer_is_correct(splits):
    for record in splits["train"] + splits["validation"]:
        a, op, b, c, boxed = parse(record)
        expected = {"+": a + b, "-": a - b, "*": a * b}[op]
        assert c == boxed == expected == int(record["answer"])
        assert record["answer"] == str(expected)


def test_operand_ranges(splits):
    for record in splits["train"]:
        a, op, b, c, _ = parse(record)
        if op == "*":
            assert 0 <= a <= 9 and 10 <= b <= 99
        else:
            assert 0 <= a <= 999 and 0 <= b <= 999
        assert c >= 0


def test_prompt_states_the_operands(splits):
    for record in splits["train"][:500]:
        a, _, b, _, _ = parse(record)
        assert re.findall(r"\d+", record["prompt"]) == [str(a), str(b)]


def test_splits_share_no_triple(splits):
    triples = {split: {parse(r)[:3] for r in records} for split, records in splits.items()}
    assert not triples["train"] & triples["validation"]
    assert len(triples["validation"]) == len(splits["validation"])  # held-out triples distinct


def test_development_split_is_disjoint_and_leaves_train_and_held_out_alone(splits):
    development = generate_development(SMALL)
    dev = [p.triple for p in development["development"]]
    assert len(dev) == len(set(dev)) == 500
    held_out = {parse(r)[:3] for r in splits["validation"]}
    train = [p.triple for p in generate_problems(SMALL)["train"]]
    assert not set(dev) & held_out
    # development_train is train, in order, without the development triples
    assert [p.triple for p in development["development_train"]] == [
        t for t in train if t not in set(dev)
    ]
    assert len(development["development_train"]) < len(train)
    # the same generator: every operator, multiplications included
    assert {op for _, op, _ in dev} == set(OPERATORS)
    # train and validation records are the same whether or not the development split is drawn
    assert build_tiny_math_splits(SMALL) == splits
    records = load_tiny_math("development", SMALL)
    assert [(parse(r)[:3]) for r in records] == dev


def test_mix_of_phrasings_and_operators(splits):
    train = splits["train"]
    bare = sum(bool(re.fullmatch(r"What is \d+ [+*-] \d+\?", r["prompt"])) for r in train)
    assert 0.4 < bare / len(train) < 0.6
    operators = [parse(r)[1] for r in train]
    for op in "+-*":
        assert operators.count(op) > len(train) / 4


def test_load_split_and_jsonl_round_trip(tmp_path):
    records = load_tiny_math("validation", SMALL)
    assert records == build_tiny_math_splits(SMALL)["validation"]
    path = tmp_path / "validation.jsonl"
    save_jsonl(records, path)
    assert load_jsonl(path) == records
    with pytest.raises(ValueError):
        load_tiny_math("test", SMALL)


def test_a_config_is_drawn_once_and_each_caller_gets_its_own_lists():
    config = TinyMathConfig(num_train=200, num_validation=20, seed=11)
    first = generate_problems(config)
    first["train"].clear()  # the caller's own list
    again = generate_problems(config)
    assert len(again["train"]) == 200 and len(again["validation"]) == 20
    assert again["train"] is not generate_problems(config)["train"]
    hits = task._drawn_splits.cache_info().hits
    load_tiny_math("validation", config)
    assert task._drawn_splits.cache_info().hits == hits + 1
