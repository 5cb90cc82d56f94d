"""A deterministic synthetic arithmetic task for the tiny embedded default.

Each problem asks for ``A op B`` with ``op`` in ``+``, ``-``, ``*``, phrased either as a bare
question ("What is 12 + 345?") or as a short word problem (about half of each). Additions and
subtractions use operands of 1 to 3 digits (a subtraction never goes below zero);
multiplications are 1-digit times 2-digit. The reference solution is ``"A op B = C. \\boxed{C}"``.

A record is ``{"prompt": str, "answer": "C", "solution": str, "operation": str}`` (operation:
"addition", "subtraction" or "multiplication", a data source to route teachers by). The
held-out ("validation") split shares no ``(A, op, B)`` triple with the train split, so held-out
accuracy measures arithmetic, not recall. Generation is seeded: the same config always gives
the same records.

For tuning, a development split ("development", 500 problems) is drawn by the same generator
after train, with distinct triples none of which is held out; "development_train" is train
without every problem that shares a triple with it. A tuning run trains on development_train
and validates on development, so nothing it reads touches the held-out split, and train and
validation stay exactly as they were (the assets are built from those two).
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path

SPLITS = ("train", "validation", "development", "development_train")
DATA_SPLITS = ("train", "validation")
"""The splits a build writes to the asset cache (the development splits are for tuning only)."""
NUM_DEVELOPMENT = 500
OPERATORS = ("+", "-", "*")
OPERATION_NAMES = {"+": "addition", "-": "subtraction", "*": "multiplication"}

# Word-problem templates; {a} and {b} are the operands in the order they appear in "A op B".
WORD_TEMPLATES = {
    "+": (
        "{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
        "A box holds {a} {item} and another holds {b}. How many {item} are there in all?",
        "What is the sum of {a} and {b}?",
        "{name} counted {a} {item} on Monday and {b} on Tuesday. How many in total?",
    ),
    "-": (
        "{name} has {a} {item} and gives away {b}. How many {item} are left?",
        "A box holds {a} {item}. {name} takes out {b}. How many {item} are still in the box?",
        "What is {a} minus {b}?",
        "{name} needs {a} {item} and already has {b}. How many more are needed?",
    ),
    "*": (
        "{name} has {a} bags with {b} {item} in each. How many {item} is that?",
        "There are {a} rows of {b} {item}. How many {item} are there?",
        "What is {a} times {b}?",
        "{name} buys {a} packs of {b} {item}. How many {item} does {name} buy?",
    ),
}
NAMES = ("Ana", "Ben", "Mia", "Sam", "Leo", "Zoe")
ITEMS = ("apples", "books", "coins", "pens", "cards", "shells")


@dataclass(frozen=True)
class TinyMathConfig:
    """What the generator produces; every field changes the data."""

    num_train: int = 50_000
    num_validation: int = 500
    word_problem_fraction: float = 0.5
    seed: int = 0


@dataclass(frozen=True)
class Problem:
    """One arithmetic question: the triple that identifies it and how it is phrased."""

    a: int
    op: str
    b: int
    prompt: str

    @property
    def triple(self) -> tuple[int, str, int]:
        return (self.a, self.op, self.b)


def compute(a: int, op: str, b: int) -> int:
    """The exact result of ``a op b``."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"unknown operator {op!r}")


def format_solution(a: int, op: str, b: int) -> str:
    """The reference solution text, e.g. ``"7 * 12 = 84. \\boxed{84}"``."""
    c = compute(a, op, b)
    return f"{a} {op} {b} = {c}. \\boxed{{{c}}}"


def to_record(problem: Problem) -> dict[str, str]:
    """The dataset record of a problem."""
    return {
        "prompt": problem.prompt,
        "answer": str(compute(problem.a, problem.op, problem.b)),
        "solution": format_solution(problem.a, problem.op, problem.b),
        "operation": OPERATION_NAMES[problem.op],
    }


def sample_operand(rng: random.Random, num_digits: int) -> int:
    """A uniform integer with exactly ``num_digits`` digits (0 counts as a 1-digit number)."""
    low = 0 if num_digits == 1 else 10 ** (num_digits - 1)
    return rng.randint(low, 10**num_digits - 1)


def sample_triple(rng: random.Random) -> tuple[int, str, int]:
    """An ``(a, op, b)`` triple: operator uniform, digit counts uniform per operand."""
    op = rng.choice(OPERATORS)
    if op == "*":
        return sample_operand(rng, 1), op, sample_operand(rng, 2)
    a = sample_operand(rng, rng.randint(1, 3))
    b = sample_operand(rng, rng.randint(1, 3))
    if op == "-" and a < b:
        a, b = b, a
    return a, op, b


def phrase(rng: random.Random, a: int, op: str, b: int, word_problem_fraction: float) -> str:
    """The prompt text of a triple: a bare question or a word problem."""
    if rng.random() >= word_problem_fraction:
        return f"What is {a} {op} {b}?"
    template = rng.choice(WORD_TEMPLATES[op])
    return template.format(a=a, b=b, name=rng.choice(NAMES), item=rng.choice(ITEMS))


def sample_problem(rng: random.Random, word_problem_fraction: float) -> Problem:
    """One random problem."""
    a, op, b = sample_triple(rng)
    return Problem(a, op, b, phrase(rng, a, op, b, word_problem_fraction))


def generate_problems(config: TinyMathConfig) -> dict[str, list[Problem]]:
    """Both splits. The held-out split is drawn first with distinct triples; the train split then
    rejects every held-out triple (train may repeat its own triples: the small multiplication
    table is sampled many times). Drawn once per process and config (a run loads both
    splits, each from both; a draw's time is in docs/tiny_assets.md); the lists are the caller's
    own."""
    return {split: list(problems) for split, problems in _drawn_splits(config).items()}


@functools.lru_cache(maxsize=4)
def _drawn_splits(config: TinyMathConfig) -> dict[str, tuple[Problem, ...]]:
    """_draw's splits as tuples of (frozen) problems: safe to share between callers."""
    return {split: tuple(problems) for split, problems in _draw(config)[0].items()}


def generate_development(config: TinyMathConfig) -> dict[str, list[Problem]]:
    """The tuning splits: "development", NUM_DEVELOPMENT problems with distinct triples drawn
    after train by the same generator (its stream continued), none held out; and
    "development_train", train without every problem whose triple is in development (a
    development multiplication is drawn many times in train: docs/tiny_assets.md counts
    them)."""
    splits, rng = _draw(config)
    held_out = {problem.triple for problem in splits["validation"]}
    development: list[Problem] = []
    chosen: set[tuple[int, str, int]] = set()
    while len(development) < NUM_DEVELOPMENT:
        problem = sample_problem(rng, config.word_problem_fraction)
        if problem.triple not in held_out and problem.triple not in chosen:
            chosen.add(problem.triple)
            development.append(problem)
    train = [problem for problem in splits["train"] if problem.triple not in chosen]
    return {"development": development, "development_train": train}


def _draw(config: TinyMathConfig) -> tuple[dict[str, list[Problem]], random.Random]:
    """Train and validation, and the generator's state after them."""
    rng = random.Random(config.seed)
    validation: list[Problem] = []
    held_out: set[tuple[int, str, int]] = set()
    while len(validation) < config.num_validation:
        problem = sample_problem(rng, config.word_problem_fraction)
        if problem.triple not in held_out:
            held_out.add(problem.triple)
            validation.append(problem)
    train: list[Problem] = []
    while len(train) < config.num_train:
        problem = sample_problem(rng, config.word_problem_fraction)
        if problem.triple not in held_out:
            train.append(problem)
    return {"train": train, "validation": validation}, rng


def build_tiny_math_splits(config: TinyMathConfig | None = None) -> dict[str, list[dict]]:
    """Both splits as records: ``{"train": [...], "validation": [...]}``."""
    problems = generate_problems(config or TinyMathConfig())
    return {split: [to_record(p) for p in items] for split, items in problems.items()}


def load_tiny_math(split: str, config: TinyMathConfig | None = None) -> list[dict]:
    """The records of one split (one of SPLITS), generated in memory.

    The train and validation records are written to ``data/<split>.jsonl`` in the tiny asset
    cache; :func:`load_jsonl` reads those files.
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    if split in DATA_SPLITS:
        return build_tiny_math_splits(config)[split]
    problems = generate_development(config or TinyMathConfig())[split]
    return [to_record(problem) for problem in problems]


def save_jsonl(records: list[dict], path: str | Path) -> None:
    """Write one JSON object per line."""
    with open(path, "w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def load_jsonl(path: str | Path) -> list[dict]:
    """Read one JSON object per line (blank lines are skipped)."""
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def write_data_splits(config: TinyMathConfig, out_dir: Path) -> dict[str, list[dict]]:
    """Generate the task's splits and write them to ``out_dir/data/<split>.jsonl``."""
    splits = build_tiny_math_splits(config)
    (out_dir / "data").mkdir()
    for split, records in splits.items():
        save_jsonl(records, out_dir / "data" / f"{split}.jsonl")
    return splits
