"""The built-in grader: answer extraction, equivalence, and refusal of hostile model output."""

import time

import pytest

from nemo_opd.environments.builtin_grader import (
    answers_equivalent,
    builtin_verify,
    extract_answer,
)

EQUIVALENT = [
    ("5", "5"),
    ("0.50", "1/2"),
    ("0.5", "\\frac{1}{2}"),
    ("\\dfrac12", "0.5"),
    ("\\tfrac{1}{2}", ".5"),
    (".5", "1/2"),
    ("-3", "-3.0"),
    ("-\\frac{3}{4}", "-0.75"),
    ("\\frac{-3}{4}", "-3/4"),
    ("6/8", "3/4"),
    ("007", "7"),
    ("1,000", "1000"),
    ("1{,}000", "1000"),
    ("1\\,000", "1000"),
    ("2^{10}", "1024"),
    ("2^-1", "0.5"),
    ("-2^2", "-4"),
    ("2\\cdot 3", "6"),
    ("3\\times 4", "12"),
    ("1e3", "1000"),
    ("\\frac{\\frac{1}{2}}{2}", "0.25"),
    ("\\left(\\frac{1}{2}\\right)", "0.5"),
    ("(1, 2)", "(1,2)"),
    ("\\left( 1, \\frac{1}{2} \\right)", "(1, 0.5)"),
    ("[0, \\frac12)", "[0,0.5)"),
    ("x + 1", "x+1"),
    ("x^{2}", "x^2"),
    ("50\\%", "50"),
    ("30^\\circ", "30"),
    ("x = 5", "5"),
    ("$12$", "12"),
    ("\\text{Yes}", "yes"),
    ("\\mathrm{B}", "B"),
    ("\\$5", "5"),
    ("3.", "3"),
    ("\u22125", "-5"),
]

NOT_EQUIVALENT = [
    ("3", "4"),
    ("-3", "3"),
    ("0.333", "1/3"),
    ("1/2", "2"),
    ("(1,2]", "(1,2)"),
    ("(1,2)", "(2,1)"),
    ("(1,2)", "(1,2,3)"),
    ("(1,2)", "1,2"),
    ("x+1", "x+2"),
    ("x^2", "x^3"),
    ("2^{10}", "1000"),
    ("1/0", "1"),
    ("", "5"),
    ("5", ""),
    ("A", "a"),
    ("50\\%", "0.5"),
    ("32, 349", "32349"),  # a list, not a thousands separator
    ("1, 000", "1000"),
]


@pytest.mark.parametrize(("predicted", "reference"), EQUIVALENT)
def test_equivalent(predicted, reference):
    assert answers_equivalent(predicted, reference)
    assert answers_equivalent(reference, predicted)


@pytest.mark.parametrize(("predicted", "reference"), NOT_EQUIVALENT)
def test_not_equivalent(predicted, reference):
    assert not answers_equivalent(predicted, reference)
    assert not answers_equivalent(reference, predicted)


EXTRACTION = [
    ("so $\\boxed{42}$.", "42"),
    ("\\boxed{\\frac{1}{\\sqrt{2}}}", "\\frac{1}{\\sqrt{2}}"),
    ("first \\boxed{3} then \\boxed{\\{1, 2\\}}", "\\{1, 2\\}"),
    ("try \\boxed{1}, no wait: \\boxed{2}.", "2"),
    ("\\boxed {7}", "7"),
    ("hence \\boxed 7$.", "7"),
    ("\\fbox{9}", "9"),
    ("\\boxed{\\text{(B)}}", "(B)"),
    ("\\boxed{1,000}", "1000"),
    ("The answer is $\\frac{1}{2}$. Done.", "\\frac{1}{2}"),
    ("So the answer is 17.\nThanks.", "17"),
    ("**Final Answer:** 3.5", "3.5"),
    ("answer: -4", "-4"),
    ("We add them: 2 + 3 = 5", "5"),
    ("so $x = \\frac{3}{4}$.", "\\frac{3}{4}"),
    ("I count 12 apples and 7 pears", "7"),
    ("the total is 1,234,567 dollars", "1234567"),
    ("nothing numeric here", None),
    ("", None),
    ("truncated \\boxed{12", None),
    ("empty \\boxed{}", None),
    ("\\boxed", None),
]


@pytest.mark.parametrize(("text", "expected"), EXTRACTION)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_verify_end_to_end():
    assert builtin_verify("... so the result is \\boxed{\\dfrac{1}{2}}.", "0.5", 100)
    assert builtin_verify("The answer is 12.", "12", 100)
    assert not builtin_verify("\\boxed{13}", "12", 100)
    assert builtin_verify("\\boxed{12}", "\\boxed{12}", 100)  # boxed references are unwrapped
    assert not builtin_verify("\\boxed{" + "1" * 50 + "}", "1" * 50, 20)  # over max_answer_chars
    assert builtin_verify("\\boxed{" + "1" * 50 + "}", "1" * 50, 100)
    assert not builtin_verify(None, "1", 100)  # type: ignore[arg-type]


HOSTILE = {
    "megabyte boxed": "\\boxed{" + "1" * 1_000_000 + "}",
    "megabyte plain": "7 " * 500_000,
    "megabyte of boxes": "\\boxed{" * 200_000,
    "10k nested braces": "\\boxed{" + "{" * 10_000 + "5" + "}" * 10_000 + "}",
    "deep parentheses": "\\boxed{" + "(" * 500 + "5" + ")" * 500 + "}",
    "power tower": "\\boxed{9^9^9^9}",
    "braced tower": "\\boxed{10^{10^{10}}}",
    "huge power": "\\boxed{10^100000000}",
    "huge power of 1": "\\boxed{1^{10^{10}}}+4",
    "huge scientific": "\\boxed{1e999999999}",
    "huge digit string": "\\boxed{" + "9" * 900 + "}",
    "power chain": "\\boxed{" + "2^" * 400 + "2}",
    "product of powers": "\\boxed{" + "*".join(["2^{9999}"] * 80) + "}",
    "unbalanced close": "\\boxed{}}}}}5}",
    "unbalanced open": "\\boxed{{{{5}",
    "null byte": "\\boxed{5\x00}",
    "direction override": "\\boxed{\u202e5}",
    "fullwidth digit": "\\boxed{\uff15}",
    "emoji and combining": "\\boxed{5\u0301\U0001f600}",
    "lone surrogate": "\\boxed{5\ud800}",
    "division by zero": "\\boxed{5/0}",
    "many fractions": "\\boxed{" + "\\frac{1}{" * 15 + "5" + "}" * 15 + "}",
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_answers_are_refused_quickly(name):
    response = HOSTILE[name]
    start = time.thread_time()  # this thread's CPU: the grader's work, whatever the load
    result = builtin_verify(response, "5", 1000)
    elapsed = time.thread_time() - start
    assert result is False
    assert elapsed < 1.0, f"{name}: {elapsed:.2f} CPU-s"  # a correctness bound, not a benchmark


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_references_do_not_raise(name):
    """A hostile string on either side of answers_equivalent is handled without raising."""
    start = time.perf_counter()
    assert answers_equivalent("5", HOSTILE[name]) in (True, False)
    assert time.perf_counter() - start < 1.0


def test_refused_bounds_are_not_computed():
    """Over-bound answers are wrong against an equal value written differently (computing it
    would be needed), but identical text is cheap to compare and counts as equal."""
    for answer, same_value in [
        ("10^100000000", "10^{100000000}"),
        ("1e999999999", "1E999999999"),
        ("9" * 1200, "0" + "9" * 1200),
        ("2^{30000}", "2^{30000}*1"),
    ]:
        assert not answers_equivalent(answer, same_value)
        assert answers_equivalent(answer, answer)
    assert answers_equivalent("2^{100}", str(2**100))  # within bounds it is computed


CAP = 1000
HUGE = "1" * 10_000_000
FILLER = "so we go on. " * 800_000  # 10 MB of text with no box and no digit
CAPPED_FORMS = {
    "boxed braces": lambda answer: FILLER + "\\boxed{" + answer + "}",
    "boxed space": lambda answer: FILLER + "\\boxed " + answer,
    "fbox": lambda answer: FILLER + "\\fbox{" + answer + "}",
    "answer is": lambda answer: FILLER + "The answer is " + answer + ". Done.",
    "equals": lambda answer: FILLER + "so x = " + answer,
    "last number": lambda answer: FILLER + "I count " + answer + " apples",
}


@pytest.fixture
def cleaned_lengths(monkeypatch):
    """The length of every string math_verify cleans (the first step after extraction)."""
    import nemo_opd.environments.builtin_grader as builtin_grader

    lengths, clean = [], builtin_grader.clean_answer

    def counted(s, thousands=True):
        lengths.append(len(s))
        return clean(s, thousands)

    monkeypatch.setattr(builtin_grader, "clean_answer", counted)
    return lengths


@pytest.mark.parametrize("form", list(CAPPED_FORMS))
def test_every_form_is_capped_at_max_answer_chars(form, cleaned_lengths):
    """An answer of max_answer_chars counts; one character more is refused, and so is a 10 MB
    answer, in every form: nothing longer than the cap reaches cleaning or parsing."""
    build = CAPPED_FORMS[form]
    assert extract_answer(build("1" * CAP), max_chars=CAP) == "1" * CAP
    assert builtin_verify(build("1" * CAP), "1" * CAP, CAP)
    assert extract_answer(build("1" * (CAP + 1)), max_chars=CAP) is None
    assert not builtin_verify(build("1" * (CAP + 1)), "1" * (CAP + 1), CAP)
    assert extract_answer(build(HUGE), max_chars=CAP) is None
    assert not builtin_verify(build(HUGE), "1", CAP)
    assert max(cleaned_lengths) <= CAP


@pytest.mark.parametrize(
    "response",
    [
        "\\boxed " + HUGE,
        "\\boxed" + " " * 10_000_000 + "5",
        "\\boxed{" + HUGE + "}",
        "\\fbox{" + "{" * 10_000_000,
        "The answer is " + HUGE,
        "x = " + HUGE,
    ],
    ids=["boxed space", "boxed after spaces", "boxed braces", "fbox", "answer is", "equals"],
)
def test_ten_megabyte_answers_are_not_read(response, cleaned_lengths):
    assert extract_answer(response, max_chars=CAP) is None
    assert not builtin_verify(response, "5", CAP)
    assert all(length <= CAP for length in cleaned_lengths)
