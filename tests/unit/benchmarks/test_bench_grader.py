"""bench_grader's side that needs no Math-Verify checkout: reading a test suite's parametrized
cases, and the tiny task's answer set."""

import sys
import textwrap
import types
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_grader  # noqa: E402


def test_suite_cases_reads_parametrize_tables(tmp_path, monkeypatch):
    tests = tmp_path / "suite" / "tests"
    tests.mkdir(parents=True)
    (tests / "__init__.py").write_text("")
    (tests / "test_cases.py").write_text(
        textwrap.dedent(
            """
            import pytest

            @pytest.mark.parametrize("gold,pred,expected", [("1", "1", 1), ("1", "2", 0)])
            def test_plain(gold, pred, expected):
                pass

            @pytest.mark.parametrize(
                "gold, pred, expected, precision", [pytest.param("$1$", "1.0", 1, 2)]
            )
            def test_option(gold, pred, expected, precision):
                pass

            @pytest.mark.parametrize("pred,expected", [("A", ["a"])])
            def test_other(pred, expected):
                pass
            """
        )
    )
    monkeypatch.setattr(sys, "path", list(sys.path))
    other = types.ModuleType("tests")  # another `tests` imported first (a test runner's)
    monkeypatch.setitem(sys.modules, "tests", other)
    cases = bench_grader.suite_cases(tests)
    assert sys.modules["tests"] is other and "tests.test_cases" not in sys.modules
    assert cases == [
        {
            "source": "test_cases.py::test_plain",
            "gold": "1",
            "pred": "1",
            "expected": True,
            "options": {},
        },
        {
            "source": "test_cases.py::test_plain",
            "gold": "1",
            "pred": "2",
            "expected": False,
            "options": {},
        },
        {
            "source": "test_cases.py::test_option",
            "gold": "$1$",
            "pred": "1.0",
            "expected": True,
            "options": {"precision": 2},
        },
    ]


def test_tiny_answers():
    responses, references = bench_grader.tiny_answers()
    assert len(responses) == len(references) == 500
    first = responses[0]
    assert first.endswith(f"\\boxed{{{int(references[0]) + 1}}}")  # every third is wrong
    assert responses[1].endswith(f"\\boxed{{{references[1]}}}")
