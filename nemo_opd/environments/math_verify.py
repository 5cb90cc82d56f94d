"""Grading a math answer: the math environment's entry point, verify(response, reference,
max_answer_chars).

Two engines (env.math.grader):
- math_verify (the default): Hugging Face's math-verify library, the grader TRL, NeMo-RL and
  verl use. It extracts the answer as the field does (\\boxed{}, "final answer is", LaTeX
  environments, plain numbers) and compares with sympy: sets, intervals, relations, labelled
  answers, symbolic equivalence, rounded decimals, units and percent words.
- builtin: builtin_grader (exact numbers and normalized text, no sympy): fast and narrow.

Marked answers only (marked_only; env.math.require_marked_answer, on by default): a response
must state its final answer in a box command or after an answer phrase ("answer is",
"answer:"), and math-verify then reads only such an answer (its anchors, as TRL's accuracy
reward reads completions: try_extract_without_anchor=False). Without it a response is read as
math-verify reads a bare answer, its last expression anywhere: "7 + 112 =" is then the right
answer to "What is 7 + 112?" (sympy evaluates 7 + 112 to 119), which GRPO on the tiny task
learned to write within 100 steps (docs/generation.md).

Before either engine, a fast path (fast_verdict) answers when the verdict is certain: the response's
one \\boxed{} holds the reference's normalized text, or both are plain numbers that are equal (or
unequal integers). The tiny task's answers all take it.

Model output is untrusted. Before math-verify sees a response it is bounded: only its last
RESPONSE_WINDOW_CHARS characters are read (from its last \\boxed{} when that lies earlier), and a
\\boxed{} answer longer than max_answer_chars, brackets nested deeper than MAX_NESTING, or control
characters, NUL bytes and lone surrogates (invalid UTF-8) make it wrong without parsing. Nothing
is executed: math-verify parses LaTeX with its ANTLR grammar, and hands sympy's parse_expr only
strings of digits, spaces and the operators + - * / ^ ( ) that its own regular expression
matched. Its signal-based time-outs are off (they fail off the main thread); sympy can still run
for minutes on a short answer ((2+sqrt 3)^1000 expanded), so verify() itself has no time limit:
the math environment runs it in grader_pool's worker processes, which kill an answer that
overruns env.math.timeout_s.
"""

import importlib.util
import re
from fractions import Fraction
from typing import Literal

from nemo_opd.environments.builtin_grader import (
    BOX_COMMANDS,
    boxed_answer,
    boxed_answer_too_long,
    builtin_verify,
    clean_answer,
    has_answer_phrase,
    has_control_chars,
    nesting_depth,
    normalize,
)

Grader = Literal["math_verify", "builtin"]
GRADERS: tuple[Grader, ...] = ("math_verify", "builtin")

RESPONSE_WINDOW_CHARS = 16_384
"""Characters of a response (and of a reference) math-verify reads: the end, where a final
answer stands. The window keeps every answer's parse short (docs/generation.md, "Costs the
bounds are sized by") and the bytes sent to a grader worker small."""

MAX_NESTING = 50
"""Deepest bracket nesting math-verify is given: deeper input makes its parser recurse for
minutes (docs/generation.md), and no real answer comes near it."""

_PLAIN_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
_BARE_NUMBER_RE = re.compile(r"\s*-?\d[\d,. ]*%?\s*")
_LATEX_MARKS = ("$", "\\(", "\\[", *BOX_COMMANDS)


def verify(
    response: str,
    reference: str,
    max_answer_chars: int,
    grader: Grader = "math_verify",
    marked_only: bool = False,
) -> bool:
    """Whether the final answer of a model response equals the reference answer.

    reference: as datasets give it: a bare answer ("12", "\\frac{1}{2}"), LaTeX ("$[0, 1)$"), or
    a whole solution whose answer is in \\boxed{} (MATH's solution column); it is parsed like the
    response. Answers longer than max_answer_chars are wrong. With marked_only, a response
    whose answer is not in a box command or after an answer phrase is wrong (the module
    docstring). Never raises: any error counts as wrong. In-process and without a time limit
    (see the module docstring).
    """
    return grade(response, reference, max_answer_chars, grader, marked_only)[0]


def grade(
    response: str,
    reference: str,
    max_answer_chars: int,
    grader: Grader = "math_verify",
    marked_only: bool = False,
) -> tuple[bool, str]:
    """(correct, how): verify()'s verdict and what gave it: "fast" (refused by a bound or for an
    unmarked answer, or fast_verdict), "builtin" or "math_verify"."""
    settled = fast_grade(response, reference, max_answer_chars, marked_only)
    if settled is not None:
        return settled
    return engine_grade(response, reference, max_answer_chars, grader, marked_only)


def engine_grade(
    response: str,
    reference: str,
    max_answer_chars: int,
    grader: Grader = "math_verify",
    marked_only: bool = False,
) -> tuple[bool, str]:
    """grade()'s verdict by the engine, for an answer fast_grade left to it (None)."""
    try:
        window = answer_window(response, max_answer_chars)
        if grader == "builtin":
            return builtin_verify(window, reference, max_answer_chars), "builtin"
        return math_verify_engine(window, reference, marked_only), "math_verify"
    except Exception:  # untrusted input: a bug here must not crash training
        return False, grader


def fast_grade(
    response: str, reference: str, max_answer_chars: int, marked_only: bool = False
) -> tuple[bool, str] | None:
    """grade()'s (correct, "fast") where no engine is needed (a bound or an unmarked answer
    makes it wrong, or fast_verdict is certain), else None."""
    if not isinstance(response, str) or not isinstance(reference, str):
        return False, "fast"
    try:
        window = answer_window(response, max_answer_chars)
        if window is None or (marked_only and not has_marked_answer(window)):
            return False, "fast"
        verdict = fast_verdict(window, reference, max_answer_chars)
    except Exception:  # untrusted input: a bug here must not crash training
        return False, "fast"
    return None if verdict is None else (verdict, "fast")


def has_marked_answer(response: str) -> bool:
    """Whether a response states an answer where a reader looks for one: in a box command or
    after an answer phrase."""
    return any(command in response for command in BOX_COMMANDS) or has_answer_phrase(response)


def fast_verdict(response: str, reference: str, max_answer_chars: int) -> bool | None:
    """True or False where math-verify's verdict is certain, else None.

    The response must hold exactly one \\boxed{...} (no \\fbox, which math-verify does not
    read) and no "final answer" phrase (which math-verify may read instead of the box); the
    reference is a bare answer or one \\boxed{} answer. Then: the same normalized text is True;
    plain numbers ("12", "-0.5", "1,000") are True when equal, and False when both are unequal
    integers (math-verify compares integers exactly, but decimals after rounding).
    """
    answer = _single_boxed_answer(response, max_answer_chars)
    if answer is None:
        return None
    if any(command in reference for command in BOX_COMMANDS):
        target = _single_boxed_answer(reference, RESPONSE_WINDOW_CHARS)
    elif len(reference) <= RESPONSE_WINDOW_CHARS:
        target = clean_answer(reference)
    else:
        target = None
    if not target or has_control_chars(answer) or has_control_chars(target):
        return None
    if normalize(answer) == normalize(target):
        return True
    value, expected = _plain_number(answer), _plain_number(target)
    if value is None or expected is None:
        return None
    if value == expected:
        return True
    if value.denominator == expected.denominator == 1 and "." not in answer + target:
        return False
    return None


def _single_boxed_answer(text: str, max_chars: int) -> str | None:
    """The cleaned content of text's only \\boxed{...}, or None (no box, several, an \\fbox, a
    "final answer" phrase, malformed, or longer than max_chars)."""
    if text.count("\\boxed") != 1 or "\\fbox" in text or "final answer" in text.lower():
        return None
    start = text.find("\\boxed")
    if not text.startswith("{", start + len("\\boxed")):
        return None  # "\boxed 5": math-verify reads only the braced form
    content = boxed_answer(text, start, max_chars)
    return None if content is None else clean_answer(content)


def _plain_number(answer: str) -> Fraction | None:
    """The exact value of a plain decimal numeral (thousands separators already dropped)."""
    text = answer.strip()
    return Fraction(text) if _PLAIN_NUMBER_RE.fullmatch(text) else None


def math_verify_engine(window: str, reference: str, marked_only: bool = False) -> bool:
    """math-verify's verdict on a response's answer_window; with marked_only it reads only an
    answer at one of its anchors (a box, "final answer is", ...)."""
    # Imported here: the driver imports this module for its names; only grader workers grade.
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse
    from math_verify import verify as math_verify_verify

    gold = _reference_window(reference)
    if gold is None:
        return False
    gold_parsed = parse(gold, parsing_timeout=None)
    if marked_only:
        anchored = [
            LatexExtractionConfig(try_extract_without_anchor=False),
            ExprExtractionConfig(try_extract_without_anchor=False),
        ]
        predicted = parse(window, extraction_config=anchored, parsing_timeout=None)
    else:
        predicted = parse(window, parsing_timeout=None)
    return bool(math_verify_verify(gold_parsed, predicted, timeout_seconds=None))


def answer_window(text: str, max_answer_chars: int) -> str | None:
    """The part of a response math-verify reads, or None when it must count as wrong: its last
    \\boxed{} answer is longer than max_answer_chars, or the part has control characters or
    brackets nested deeper than MAX_NESTING."""
    box_at = _last_box(text)
    if box_at >= 0 and boxed_answer_too_long(text, box_at, max_answer_chars):
        return None
    window = response_window(text)
    if has_control_chars(window) or nesting_depth(window) > MAX_NESTING:
        return None
    return window


def response_window(text: str) -> str:
    """text's last RESPONSE_WINDOW_CHARS characters, or as many from its last \\boxed{} when
    that lies earlier: the part a grader reads."""
    if len(text) <= RESPONSE_WINDOW_CHARS:
        return text
    start = len(text) - RESPONSE_WINDOW_CHARS
    box_at = _last_box(text)
    if 0 <= box_at < start:
        start = box_at
    return text[start : start + RESPONSE_WINDOW_CHARS]


def _last_box(text: str) -> int:
    """Where text's last box command starts, or -1."""
    return max(text.rfind(command) for command in BOX_COMMANDS)


def _reference_window(reference: str) -> str | None:
    """The reference as math-verify should read it: a solution or LaTeX text as it is, a bare
    number as it is (math-verify reads "1,22" as 1.22), any other bare answer inside $...$."""
    window = answer_window(reference, RESPONSE_WINDOW_CHARS)
    if window is None or any(mark in window for mark in _LATEX_MARKS):
        return window
    if _BARE_NUMBER_RE.fullmatch(window):
        return window
    return f"${window.strip()}$"


KNOWN_RIGHT = ("\\boxed{\\frac{x}{2}}", "$\\frac{x}{2}+0$")
"""A right answer the fast path leaves to the engine: load_engine grades it."""


class EngineError(RuntimeError):
    """The grading engine cannot be loaded, or grades a known right answer wrong."""


def check_engine_installed(grader: Grader) -> None:
    """EngineError where the engine's package is not installed (a quick check, nothing
    imported)."""
    if grader == "math_verify" and importlib.util.find_spec("math_verify") is None:
        raise EngineError(
            "env.math.grader is math_verify, but the math-verify package is not installed in "
            "this environment: install it (pip install math-verify), or set "
            "env.math.grader=builtin"
        )


def load_engine(grader: Grader) -> None:
    """Load the engine (math-verify builds its grammar on first use) and grade KNOWN_RIGHT with
    it, outside grade()'s catch-all: an engine that fails to import or grades it wrong (a
    broken install: another ANTLR runtime than its grammar's, say) raises EngineError instead
    of grading every answer that needs it wrong."""
    if grader == "builtin":
        return
    response, reference = KNOWN_RIGHT
    try:
        right = math_verify_engine(answer_window(response, 100), reference)
    except Exception as error:
        message = f"math-verify could not grade: {type(error).__name__}: {error}"
        raise EngineError(f"{message}; reinstall it, or set env.math.grader=builtin") from error
    if not right:
        raise EngineError(
            f"math-verify graded a right answer wrong ({response} against {reference}): its "
            "install is broken (its LaTeX grammar needs the ANTLR runtime it was built for); "
            "reinstall it, or set env.math.grader=builtin"
        )
