"""The math environment's entry point, verify(): agreement with math-verify's own test suite, the
fast path, reference forms, the engines, and the bounds applied before math-verify parses.

The cases below are a sample of huggingface/Math-Verify's test suite (answer pairs with the
verdict its tests expect), one group per kind of answer; the file and test each comes from is
named. benchmarks/bench_grader.py measures the whole suite (docs/generation.md has the figure).
"""

import pytest

from nemo_opd.environments.math_verify import (
    MAX_NESTING,
    RESPONSE_WINDOW_CHARS,
    answer_window,
    fast_verdict,
    grade,
    response_window,
    verify,
)

# (gold, prediction, expected): huggingface/Math-Verify tests/test_all.py
ALL = "tests/test_all.py"
NUMINA = "tests/test_numina_cases.py::test_numina_cases"
OPEN_THOUGHTS = "tests/test_open_thoughts.py::test_open_thoughts"
YUJIANLL = "tests/test_yujianll.py::test_string_extraction"
SUITE_SAMPLE = {
    "sets, unordered lists, several boxes": [
        (
            OPEN_THOUGHTS,
            r"$$\boxed{2}, \boxed{3}, \boxed{5}, \boxed{7}, \boxed{13}$$",
            r"$${2, 3, 5, 7, 13}$$",
            1,
        ),
        (NUMINA, r"$-12;-11;-10;-8;-7;-6$", r"$\boxed{\{-12, -11, -10, -8, -7, -6\}}$", 1),
        (NUMINA, r"$(11,7)or(7,11)$", r"$\boxed{(7,11),\ (11,7)}$", 1),
        (OPEN_THOUGHTS, r"$${1,2,3}$$", r"\boxed{1} and \boxed{2} and \boxed{3}", 1),
        (OPEN_THOUGHTS, r"\boxed{1} no no no no no \boxed{2}", r"$\boxed{1,2}$", 0),
        (f"{ALL}::test_sets_handling", r"$[0,9)$", r"$[0,1)$", 0),
    ],
    "and / or, plus-minus": [
        (NUMINA, r"\(\boxed{1}\) and \(\boxed{-2}\).", r"$\boxed{-2,1}$.", 1),
        (NUMINA, r"\(\boxed{6 \text{ and } 8}\)", r"$\boxed{6,8}$", 1),
        (YUJIANLL, r"$19, 46, and 82$", r"$19, 46, \text{ and } 82$", 1),
        (YUJIANLL, r"$19, 46, and 82$", r"$21, 36, and 82$", 0),
        (YUJIANLL, r"$\pm 2021$", r"${-2021, 2021}$", 1),
        (YUJIANLL, r"$\pm 2021$", r"$2021$", 0),
    ],
    "relations and intervals": [
        (OPEN_THOUGHTS, r"$$-793 < a < 10$$", r"$$(-793, 10)$$", 1),
        (f"{ALL}::test_relations_math", r"$x \leq 5$", r"$5 \geq x$", 1),
        (f"{ALL}::test_relations_math", r"$x < 1$", r"$-x > -1$", 1),
        (f"{ALL}::test_relations_math", r"$x \geq 5$", r"The solution is $x \leq 5$", 0),
        (
            NUMINA,
            r"$1\leq|z|\leq \frac{3}{2}$",
            r"$z \in \left[-\frac{3}{2}, -1\right] \cup \left[1, \frac{3}{2}\right]$",
            1,
        ),
    ],
    "labelled answers": [
        (NUMINA, r"$(p,q)=(3,2)$", r"$(3,2)$", 1),
        (NUMINA, r"$AB=4,CD=5$", r"$\boxed{4, 5}$", 1),
        (OPEN_THOUGHTS, r"$$f(x)=1$$", r"$$1$$", 1),
        (OPEN_THOUGHTS, r"$$a_3 = 2, a_{37} = 19$$", r"$$\boxed{a_{37} = 19, \quad a_3 = 2}$$", 1),
        (f"{ALL}::test_relations_math", r"$a^2 + b = 0$", r"$0$", 0),
    ],
    "symbolic equivalence": [
        (
            f"{ALL}::test_complex_math_expressions",
            r"$\frac{x+2}{7}$",
            r"$\frac{x}{7}+\frac{2}{7}$",
            1,
        ),
        (f"{ALL}::test_complex_math_expressions", r"$\tan^2(y)+1$", r"$\sec^2(y)$", 1),
        (f"{ALL}::test_relations_math", r"$2x+4y-3=0$", r"$y=-\frac{1}{2}x+\frac{3}{4}$", 1),
        (f"{ALL}::test_math_extraction_edge_cases", r"$4$", r"$4\sqrt{2}$", 0),
    ],
    "chained = and approx, rounded decimals": [
        (f"{ALL}::test_relations_math", r"$x = 11$", r"$x = 5+5+1 = 7 =11$", 1),
        (f"{ALL}::test_relations_math", r"$11$", r"$x\approx11$", 1),
        (f"{ALL}::test_complex_math_expressions", r"$\frac{1}{12}$", r"$0.0833333333333333$", 1),
    ],
    "units, percent words, text, decimal commas": [
        (f"{ALL}::test_number_extraction", "1,22", "1.22", 1),
        (f"{ALL}::test_number_extraction", "7425000", "7,425,000", 1),
        (f"{ALL}::test_number_extraction", "1000.99", "so the number is 10 which is 1,000.99m²", 1),
        (f"{ALL}::test_number_extraction", "2", "AZYUK2A", 0),
        (f"{ALL}::test_percent_notation", r"$28\%$", "28 percent", 1),
        (f"{ALL}::test_percent_notation", r"$28\%$", r"$\boxed{28 pct}", 1),
        (
            f"{ALL}::test_latex_notation_math",
            r"$125$ miles",
            r"The distance is $\boxed{125\textnormal{ miles}}.$",
            1,
        ),
        (OPEN_THOUGHTS, r"$$0.06 \text{ yuan}$$", r"$$\boxed{0.06 \text{ yuan}}$$", 1),
    ],
    "LaTeX shorthand": [
        (f"{ALL}::test_latex_notation", r"$\sqrt{3}$", r"$\sqrt3 $", 1),
        (f"{ALL}::test_latex_notation", r"$1/3$", r"$\cfrac{1}{3} $", 1),
        (f"{ALL}::test_latex_notation", r"$1$", r"$\frac3{3} $", 1),
        (f"{ALL}::test_latex_notation", r"$1/3$", r"$k = \frac{1}{3}$", 1),
    ],
}
CASES = [
    pytest.param(gold, pred, expected, id=f"{kind}: {source.split('::')[-1]} {i}")
    for kind, rows in SUITE_SAMPLE.items()
    for i, (source, gold, pred, expected) in enumerate(rows)
]


@pytest.mark.parametrize(("gold", "pred", "expected"), CASES)
def test_math_verify_suite_sample(gold, pred, expected):
    assert verify(pred, gold, 1000) is bool(expected)


def test_a_list_is_not_a_thousands_separator():
    """The built-in grader used to accept it; math-verify reads a set of two numbers."""
    assert not verify(r"\boxed{32, 349}", "32349", 1000)
    assert not verify(r"\boxed{32, 349}", "32349", 1000, grader="builtin")
    assert verify(r"\boxed{32,349}", "32349", 1000)


@pytest.mark.parametrize(
    "reference",
    [
        "\\frac{1}{2}",  # a bare LaTeX answer (MATH's answer column)
        "$\\frac{1}{2}$",
        "0.5",
        # a whole solution (MATH's solution column)
        "Half of the cake is left, so the fraction is $\\boxed{\\frac{1}{2}}$.",
    ],
)
def test_references_as_datasets_give_them(reference):
    assert verify("So the answer is $\\boxed{\\dfrac12}$.", reference, 1000)
    assert not verify("So the answer is $\\boxed{\\frac13}$.", reference, 1000)


def test_bare_references_are_read_as_latex():
    assert verify(r"\boxed{\sqrt{2}/2}", r"\frac{\sqrt{2}}{2}", 1000)
    assert verify(r"\boxed{(3, \frac{\pi}{2})}", r"\left( 3, \frac{\pi}{2} \right)", 1000)
    assert verify(r"\boxed{[-2, 7]}", "[-2,7]", 1000)
    assert not verify(r"\boxed{(-2, 7)}", "[-2,7]", 1000)


FAST = [
    (r"3 + 9 = 12. \boxed{12}", "12", True),
    (r"\boxed{012}", "12", True),
    (r"\boxed{1,000}", "1000", True),
    (r"\boxed{2.50}", "2.5", True),
    (r"\boxed{\frac{1}{2}}", "\\frac{1}{2}", True),  # the same normalized text
    (r"\boxed{13}", "12", False),
    (r"\boxed{-12}", "12", False),
    (r"\boxed{x}", "\\boxed{x}", True),
]
NOT_FAST = [
    (r"\boxed{3.3333333}", r"\frac{10}{3}", "not a plain number"),
    (r"\boxed{3.333}", "3.334", "decimals compare after rounding in math-verify"),
    (r"\boxed{12} and \boxed{13}", "12", "several boxes"),
    (r"\fbox{12}", "12", "an fbox"),
    (r"\boxed 12", "12", "the space form"),
    (r"\boxed{12}. The final answer is $13$", "12", "a final-answer phrase"),
    (r"The answer is 12", "12", "no box"),
    (r"\boxed{2^{10}}", "1024", "not a plain number"),
]


@pytest.mark.parametrize(("response", "reference", "expected"), FAST)
def test_fast_path_settles_certain_answers(response, reference, expected):
    assert fast_verdict(response, reference, 1000) is expected
    assert grade(response, reference, 1000) == (expected, "fast")


@pytest.mark.parametrize(("response", "reference", "why"), NOT_FAST)
def test_fast_path_leaves_the_rest_to_the_engine(response, reference, why):
    assert fast_verdict(response, reference, 1000) is None, why
    assert grade(response, reference, 1000)[1] == "math_verify"


def test_fast_path_agrees_with_math_verify():
    """Every verdict the fast path gives is math-verify's own."""
    from math_verify import parse
    from math_verify import verify as library_verify

    for response, reference, expected in FAST:
        gold = parse(f"${reference}$" if "\\boxed" not in reference else reference)
        assert library_verify(gold, parse(response)) is expected, response


def test_engines():
    assert verify(r"\boxed{x+1}", "1+x", 1000)
    assert not verify(r"\boxed{x+1}", "1+x", 1000, grader="builtin")
    assert grade(r"\boxed{x+1}", "1+x", 1000, "builtin") == (False, "builtin")


@pytest.mark.parametrize("grader", ["math_verify", "builtin"])
def test_marked_answers_only(grader):
    # What GRPO on the tiny task learned to write with math-verify's default reading: the
    # question restated, which sympy evaluates to the reference.
    assert verify("7 + 112 =", "119", 1000) and verify("7 + 112 = 119.", "119", 1000)
    for response in ("7 + 112 =", "7 + 112 = 119.", "119", "$119$", ""):
        assert grade(response, "119", 1000, grader, marked_only=True) == (False, "fast")
    for response in (
        r"7 + 112 = 119. \boxed{119}",
        "The answer is 119.",
        "Answer: $119$",
    ):
        assert verify(response, "119", 1000, grader, marked_only=True), response
    # math-verify reads the marked answer, not the last expression
    assert not verify("The answer is 120, not 7 + 112.", "119", 1000, grader, marked_only=True)


def test_max_answer_chars():
    long = "1" * 50
    assert verify(f"\\boxed{{{long}}}", long, 50)
    assert not verify(f"\\boxed{{{long}1}}", f"{long}1", 50)
    # an over-long box is wrong even where its text goes on, but a short truncated one is read
    assert answer_window("\\boxed{" + "9" * 10**6 + "}", 1000) is None
    assert answer_window("3 + 9 = 12. \\boxed{12", 1000) is not None


def test_windows_are_bounded():
    text = "x" * (3 * RESPONSE_WINDOW_CHARS) + "\\boxed{5}"
    assert response_window(text) == text[-RESPONSE_WINDOW_CHARS:]
    early = "\\boxed{5}" + "y" * (3 * RESPONSE_WINDOW_CHARS)
    assert response_window(early).startswith("\\boxed{5}")
    assert len(response_window(early)) == RESPONSE_WINDOW_CHARS
    assert verify(early, "5", 1000)
    assert verify(text, "5", 1000)


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed{5\x00}",
        "\\boxed{5}\udcff",  # invalid UTF-8 decoded with surrogateescape
        "\\boxed{\u202e5}",
        "\\boxed{" + "(" * (MAX_NESTING + 1) + "5" + ")" * (MAX_NESTING + 1) + "}",
    ],
    ids=["NUL", "lone surrogate", "direction override", "deep nesting"],
)
def test_refused_without_parsing(response):
    assert grade(response, "5", 1000) == (False, "fast")


def test_never_raises():
    assert not verify(None, "1", 100)  # type: ignore[arg-type]
    assert not verify("\\boxed{1}", None, 100)  # type: ignore[arg-type]
    assert not verify("", "", 100)
