"""The math grader: agreement with math-verify's own test suite, and answers per second.

    uv run --extra cpu python benchmarks/bench_grader.py --math-verify-tests PATH [--json FILE]

Agreement: every (gold, prediction, expected verdict) case of huggingface/Math-Verify's test
suite (PATH is a checkout's tests/ folder; its test modules are imported and their
pytest.mark.parametrize tables read) graded by nemo_opd's verify() with each engine, and by the
math-verify library itself the way its README calls it (parse() on both sides, verify() with its
defaults). A case counts as agreeing when the verdict is the one the suite's test expects; some
of its tests pass non-default options (a precision, strict=False), which a grader with one
setting cannot match, so no grader reaches 100%.

Throughput: answers per second through the grader pool (GraderPool.grade: worker processes, one
answer in flight each, the process boundary included) for two answer sets, each engine, pool
sizes 1 and 2:
    tiny      the tiny task's 500 held-out problems answered in its solution format
              ("A op B = C. \\boxed{C}"), every third answer wrong (the fast path settles all)
    suite     the Math-Verify cases (mostly LaTeX, the engine does the work)
Each figure is the median of --repeats timed passes after one untimed pass.
"""

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path


def suite_cases(tests_dir: Path) -> list[dict]:
    """{"source", "gold", "pred", "expected", "options"} for every parametrized case of the
    Math-Verify test modules that has a gold and a prediction. They import as the package
    `tests` of their checkout: any other `tests` already imported (a test runner's) is set
    aside meanwhile and put back after."""
    sys.path.insert(0, str(tests_dir.resolve().parent))
    others = _pop_tests_package()
    cases = []
    try:
        for path in sorted(tests_dir.glob("test_*.py")):
            module = importlib.import_module(f"tests.{path.stem}")
            for name, test in vars(module).items():
                if not name.startswith("test_"):
                    continue
                for mark in getattr(test, "pytestmark", []):
                    cases += _parametrized_cases(mark, f"{path.name}::{name}")
    finally:
        _pop_tests_package()
        sys.modules.update(others)
    return cases


def _pop_tests_package() -> dict:
    """Remove the package `tests` and its modules from sys.modules; what was removed."""
    names = [name for name in sys.modules if name == "tests" or name.startswith("tests.")]
    return {name: sys.modules.pop(name) for name in names}


def _parametrized_cases(mark, source: str) -> list[dict]:
    """The cases of one pytest.mark.parametrize mark (none unless it names gold and pred)."""
    if mark.name != "parametrize":
        return []
    names = mark.args[0]
    names = [n.strip() for n in (names.split(",") if isinstance(names, str) else names)]
    if "gold" not in names or "pred" not in names:
        return []
    cases = []
    for values in mark.args[1]:
        row = dict(zip(names, getattr(values, "values", values), strict=True))
        expected = row.pop("expected", row.pop("result", None))
        gold, pred = row.pop("gold"), row.pop("pred")
        cases.append(
            {
                "source": source,
                "gold": gold,
                "pred": pred,
                "expected": bool(expected),
                "options": row,
            }
        )
    return cases


def library_verdict(gold: str, pred: str) -> bool:
    """math-verify's verdict as its README calls it."""
    from math_verify import parse, verify

    return bool(verify(parse(gold), parse(pred)))


def agreement(cases: list[dict]) -> list[dict]:
    """One row per grader: agreeing cases, wrong accepts, wrong rejects, seconds."""
    from nemo_opd.environments.math_verify import verify

    graders = {
        "nemo_opd verify (math_verify)": lambda c: verify(c["pred"], c["gold"], 1000),
        "nemo_opd verify (builtin)": lambda c: verify(c["pred"], c["gold"], 1000, "builtin"),
        "math-verify 0.9.0 parse+verify": lambda c: library_verdict(c["gold"], c["pred"]),
    }
    rows = []
    for name, grader in graders.items():
        start = time.perf_counter()
        verdicts = [grader(case) for case in cases]
        seconds = time.perf_counter() - start
        expected = [case["expected"] for case in cases]
        pairs = list(zip(verdicts, expected, strict=True))
        rows.append(
            {
                "grader": name,
                "cases": len(cases),
                "agree": sum(v == e for v, e in pairs),
                "agreement": sum(v == e for v, e in pairs) / len(cases),
                "wrong_accepts": sum(v and not e for v, e in pairs),
                "wrong_rejects": sum(e and not v for v, e in pairs),
                "seconds": seconds,
                "disagreements": [
                    {k: case[k] for k in ("source", "gold", "pred", "expected")}
                    for case, (v, e) in zip(cases, pairs, strict=True)
                    if v != e
                ],
            }
        )
    return rows


def tiny_answers() -> tuple[list[str], list[str]]:
    """(responses, references) for the tiny task's held-out problems."""
    from nemo_opd.tiny.task import load_tiny_math

    records = load_tiny_math("validation")
    responses = []
    for i, record in enumerate(records):
        answer = int(record["answer"]) + (1 if i % 3 == 0 else 0)
        head = record["solution"].split("=")[0]
        responses.append(f"{head}= {answer}. \\boxed{{{answer}}}")
    return responses, [record["answer"] for record in records]


def throughput(answer_sets: dict, repeats: int) -> list[dict]:
    """Answers per second through GraderPool, per answer set, engine and pool size."""
    from nemo_opd.environments.grader_pool import GraderPool

    rows = []
    for grader in ("math_verify", "builtin"):
        for workers in (1, 2):
            pool = GraderPool(workers, 10.0, 1000, grader, 2048)
            try:
                for name, (responses, references) in answer_sets.items():
                    pool.grade(responses, references)  # untimed: warms the engine's caches
                    seconds = []
                    for _ in range(repeats):
                        start = time.perf_counter()
                        report = pool.grade(responses, references)
                        seconds.append(time.perf_counter() - start)
                    median = statistics.median(seconds)
                    rows.append(
                        {
                            "answers": name,
                            "grader": grader,
                            "workers": workers,
                            "count": len(responses),
                            "fast_path": report.fast,
                            "seconds": median,
                            "answers_per_second": len(responses) / median,
                        }
                    )
            finally:
                pool.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--math-verify-tests",
        type=Path,
        required=True,
        help="the tests/ folder of a huggingface/Math-Verify checkout",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args()

    cases = suite_cases(args.math_verify_tests)
    print(f"{len(cases)} cases from {args.math_verify_tests}", flush=True)
    agree = agreement(cases)
    for row in agree:
        print(
            f"{row['grader']:34s} agree {row['agree']}/{row['cases']} ({row['agreement']:.1%})"
            f"  wrong accepts {row['wrong_accepts']}  wrong rejects {row['wrong_rejects']}"
            f"  {row['seconds']:.1f} s",
            flush=True,
        )
    sets = {
        "tiny": tiny_answers(),
        "suite": ([c["pred"] for c in cases], [c["gold"] for c in cases]),
    }
    speed = throughput(sets, args.repeats)
    header = ("answers", "grader", "workers", "count", "fast", "answers/s")
    print("{:8s} {:12s} {:>7s} {:>6s} {:>5s} {:>10s}".format(*header))
    for row in speed:
        print(
            f"{row['answers']:8s} {row['grader']:12s} {row['workers']:7d} {row['count']:6d}"
            f" {row['fast_path']:5d} {row['answers_per_second']:10.0f}",
            flush=True,
        )
    if args.json:
        from harness import run_meta

        meta = run_meta()
        results = {"meta": meta, "agreement": agree, "throughput": speed}
        args.json.write_text(json.dumps(results, indent=2, ensure_ascii=False))


if __name__ == "__main__":
    main()
