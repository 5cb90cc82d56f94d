"""The built-in grader: pull the final answer out of a model response and compare it with a
reference answer. Pure functions, no sympy, no eval. It is the math environment's fast path (see
math_verify.fast_verdict) and, with env.math.grader=builtin, its whole grading engine.

Model output is untrusted, so every step is bounded: answers longer than max_answer_chars (in
every form, found by reading at most a few characters past that limit, before any cleaning or
parsing), nesting deeper than _MAX_DEPTH, literals with more than _MAX_DIGITS digits, and
arithmetic whose result would exceed _MAX_BITS bits are refused (counted as wrong) instead of
computed; only identical normalized text, which costs nothing to compare, still matches. Numbers
are compared exactly with fractions.Fraction.

Decisions worth knowing:
- A percent sign is dropped: "50\\%" equals "50" (not "0.5"); references and models disagree on
  whether to write the sign, rarely on the scale.
- Degree marks (^\\circ, °) and \\text{}-style wrappers are dropped.
- "x=5" equals "5" when the other side has no "=".
- Decimals are exact: "0.333" is not "1/3".
- If a response contains \\boxed but its last one is malformed (e.g. a truncated "\\boxed{12"),
  there is no answer; the plain forms are only used when there is no \\boxed/\\fbox at all.
"""

import re
import unicodedata
from fractions import Fraction

_MAX_DEPTH = 20
"""Deepest bracket nesting accepted in an answer (and parser recursion budget)."""

_MAX_DIGITS = 1000
"""Longest digit run accepted in a number literal."""

_MAX_BITS = 20_000
"""Largest numerator/denominator (in bits) any intermediate result may have (about 6000 digits)."""

_HARD_MAX_CHARS = 10_000
"""answers_equivalent refuses longer strings whatever the caller's limit."""

_TAIL_CHARS = 4096
"""Plain-form answers ("The answer is 5") are looked for only in the response's last characters:
the final answer is stated at the end, and it keeps the regex work small on huge responses."""


class _Refused(Exception):
    """An answer exceeded a work bound; it counts as wrong (no string-compare fallback)."""


# ---------------------------------------------------------------------------------------------
# Extraction
# ---------------------------------------------------------------------------------------------

BOX_COMMANDS = ("\\boxed", "\\fbox")
_BRACE_RE = re.compile(r"\\[{}]|[{}]")  # escaped braces first, so "\{" is skipped
_ANSWER_RE = re.compile(r"(?i)\banswer\b\**\s*(?:is\b|:)")
_SPACES_RE = re.compile(r"[ \t]*")
_TOKEN_RE = re.compile(r"[^\s$]+")
_NUMBER_RE = re.compile(
    r"(?:(?<![\w)}\]])-)?(?:\d{1,3}(?:,\d{3})+(?!\d)|\d+)(?:\.\d+)?(?:/\d+)?|(?<![\w.])\.\d+"
)
_WRAPPER_RE = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox|textup)\s*\{([^{}]*)\}")
_THOUSANDS_RE = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def has_answer_phrase(text: str) -> bool:
    """Whether text states an answer in words ("answer is", "answer:", any case)."""
    return _ANSWER_RE.search(text) is not None


def extract_answer(text: str, max_chars: int | None = None) -> str | None:
    """The final answer of a model response, or None.

    The content of the last \\boxed{...} / \\fbox{...} (balanced braces, nesting allowed) or
    "\\boxed 5" space form; without any box, the last "answer is X" / "answer: X", else "= X"
    ending the last line, else the last number. The result is lightly cleaned ($, trailing
    period, \\text{} wrappers, thousands separators). With max_chars, an answer longer than that
    (before cleaning), in any form, gives None: it is found by reading at most a few characters
    more than max_chars past its start, and nothing longer is cleaned or parsed.
    """
    if not isinstance(text, str):
        return None
    cap = len(text) if max_chars is None else max_chars
    box_at = max(text.rfind(cmd) for cmd in BOX_COMMANDS)
    if box_at >= 0:
        raw = _boxed_content(text, box_at, cap)
    else:
        raw = _plain_answer(text[-_TAIL_CHARS:], cap)
    if raw is None or len(raw) > cap:
        return None
    cleaned = clean_answer(raw)
    return cleaned or None


def _boxed_content(text: str, start: int, cap: int) -> str | None:
    """The argument of the box command at start, or None if it is malformed or longer than cap
    characters. Reads at most cap characters of spaces after the command and cap + 2 after
    them."""
    pos = start + next(len(c) for c in BOX_COMMANDS if text.startswith(c, start))
    j = _SPACES_RE.match(text, pos, pos + cap).end()
    end = j + cap + 2  # "{", at most cap characters, "}"
    if text.startswith("{", j):
        depth = 0
        for m in _BRACE_RE.finditer(text, j, end):
            tok = m.group()
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if depth == 0:
                    return text[j + 1 : m.start()]
        return None  # unbalanced (e.g. a truncated response) or longer than cap
    if j > pos:  # "\boxed 5": one token after the space
        m = _TOKEN_RE.match(text, j, end)
        return m.group() if m else None
    return None  # "\boxedx" or "\boxed" at the very end


def boxed_answer(text: str, start: int, cap: int) -> str | None:
    """The argument of the box command at start, or None when it is malformed or longer than cap
    characters; at most about 2 * cap characters of text are read."""
    raw = _boxed_content(text, start, cap)
    return raw if raw is not None and len(raw) <= cap else None


def boxed_answer_too_long(text: str, start: int, cap: int) -> bool:
    """Whether the box command at start has no answer of at most cap characters while more than
    that follows it: an over-long or never-closed answer, not a response cut short inside a
    short one."""
    after = len(text) - start - next(len(c) for c in BOX_COMMANDS if text.startswith(c, start))
    return boxed_answer(text, start, cap) is None and after > cap + 2  # "{" + cap + "}"


def _plain_answer(tail: str, cap: int) -> str | None:
    """An unboxed final answer from the end of a response (see extract_answer); an answer is
    cut to a few characters past cap before it is looked at further."""
    matches = list(_ANSWER_RE.finditer(tail))
    if matches:
        rest = tail[matches[-1].end() :].split("\n", 1)[0].strip(" \t*:")
        # An answer of at most cap characters ends within cap + 4 ("$$", cap, "$$").
        ans = _first_statement(rest[: cap + 4])
        if ans:
            return ans
    lines = [ln for ln in tail.strip().split("\n") if ln.strip()]
    if lines and "=" in lines[-1]:
        after = lines[-1][lines[-1].rfind("=") + 1 :].strip()
        if len(after) > cap:
            return None
        if clean_answer(after):
            return after
    numbers = _NUMBER_RE.findall(tail)
    return numbers[-1] if numbers else None


def _first_statement(s: str) -> str:
    """The answer part of "X. More text": a $...$ span if it starts with one, else up to the
    first period followed by whitespace."""
    if s.startswith("$"):
        end = s.find("$", 1)
        if s.startswith("$$"):
            end = s.find("$$", 2)
            return s[2:end] if end > 0 else s
        return s[1:end] if end > 0 else s
    m = re.search(r"\.(?=\s)", s)
    return s[: m.start()] if m else s


def clean_answer(s: str, thousands: bool = True) -> str:
    """Light cleanup of an extracted answer: $ signs, \\text{}-style wrappers, a trailing period,
    and with thousands, thousands separators ("1,000" -> "1000", but not "32, 349": a list)."""
    s = s.strip().replace("\\$", "").replace("$", "")
    for _ in range(_MAX_DEPTH):  # bounded: each pass unwraps one level
        new = _WRAPPER_RE.sub(r"\1", s)
        if new == s:
            break
        s = new
    s = s.strip().rstrip(".").strip()
    s = s.replace("{,}", ",")
    if thousands and _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    return s


# ---------------------------------------------------------------------------------------------
# Normalization and comparison
# ---------------------------------------------------------------------------------------------

_REMOVE = ("\\!", "\\,", "\\;", "\\:", "\\ ", "~", "\\quad", "\\qquad", "\\displaystyle")
_DEGREES_RE = re.compile(r"\^\s*\{?\s*\\circ\s*\}?|°")
_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right)(?![a-zA-Z])")
_ASSIGN_RE = re.compile(r"[a-zA-Z]=")


def has_control_chars(s: str) -> bool:
    """Control or format characters other than whitespace (null bytes, direction overrides) or
    lone surrogates (invalid UTF-8 decoded with surrogateescape): never in a real answer."""
    return any(unicodedata.category(c) in ("Cc", "Cf", "Cs") and not c.isspace() for c in s)


def nesting_depth(s: str) -> int:
    """Deepest bracket nesting of any kind."""
    depth = best = 0
    for c in s:
        if c in "({[":
            depth += 1
            best = max(best, depth)
        elif c in ")}]":
            depth -= 1
    return best


def normalize(s: str) -> str:
    """Canonical text of an answer for comparison: cleaned, LaTeX spacing/sizing removed,
    \\dfrac/\\tfrac -> \\frac, \\cdot/\\times -> *, degree and percent signs dropped, no
    whitespace."""
    s = clean_answer(s).replace("\u2212", "-")
    for token in _REMOVE:
        s = s.replace(token, " ")
    s = _LEFT_RIGHT_RE.sub("", s)
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("\\cdot", "*").replace("\\times", "*")
    s = _DEGREES_RE.sub("", s)
    s = s.replace("\\%", "").replace("%", "")
    s = "".join(s.split())
    s = re.sub(r"\^\{(\w)\}", r"^\1", s)  # x^{2} -> x^2
    # Separators were collapsed above, while the spaces still told "1,000" from "32, 349".
    return clean_answer(s, thousands=False)


def answers_equivalent(predicted: str, reference: str) -> bool:
    """Whether two answers mean the same: exact numbers (integers, decimals, fractions,
    \\frac, powers with bounded integer exponents), tuples/intervals elementwise, else normalized
    text. Refuses (False) oversized, deeply nested or control-character input. Never raises."""
    try:
        for s in (predicted, reference):
            if not isinstance(s, str) or len(s) > _HARD_MAX_CHARS or has_control_chars(s):
                return False
            if nesting_depth(s) > _MAX_DEPTH:
                return False
        pred, ref = normalize(predicted), normalize(reference)
        if not pred or not ref:
            return False
        return _equivalent(pred, ref, 0)
    except (_Refused, RecursionError, ValueError, OverflowError, MemoryError):
        return False


def _equivalent(pred: str, ref: str, depth: int) -> bool:
    """Compare two normalized answers (see answers_equivalent)."""
    if depth > _MAX_DEPTH:
        raise _Refused("too deep")
    if pred == ref:
        return True
    if "=" not in ref and _ASSIGN_RE.match(pred) and pred.count("=") == 1:
        return _equivalent(pred[2:], ref, depth + 1)
    if "=" not in pred and _ASSIGN_RE.match(ref) and ref.count("=") == 1:
        return _equivalent(pred, ref[2:], depth + 1)
    seq_p, seq_r = _as_sequence(pred), _as_sequence(ref)
    if seq_p is not None or seq_r is not None:
        if seq_p is None or seq_r is None:
            return False
        (open_p, items_p, close_p), (open_r, items_r, close_r) = seq_p, seq_r
        if (open_p, close_p) != (open_r, close_r) or len(items_p) != len(items_r):
            return False
        return all(_equivalent(a, b, depth + 1) for a, b in zip(items_p, items_r, strict=True))
    value_p, value_r = parse_number(pred), parse_number(ref)
    if value_p is not None and value_r is not None:
        return value_p == value_r
    if pred.isalpha() and ref.isalpha() and len(pred) > 1:
        return pred.casefold() == ref.casefold()  # words: "Yes" == "yes"
    return False


def _split_top_level(s: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    parts, depth, last = [], 0, 0
    for i, c in enumerate(s):
        if c in "({[":
            depth += 1
        elif c in ")}]":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(s[last:i])
            last = i + 1
    parts.append(s[last:])
    return parts


def _as_sequence(s: str) -> tuple[str, list[str], str] | None:
    """(opening bracket, items, closing bracket) of a tuple/interval "(1,2]" or a bare list
    "1,2"; None if s has no top-level comma."""
    if len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        inner = _split_top_level(s[1:-1])
        if len(inner) > 1 and all(inner):
            return s[0], inner, s[-1]
    items = _split_top_level(s)
    if len(items) > 1:
        return "", items, ""
    return None


# ---------------------------------------------------------------------------------------------
# Exact arithmetic on a small grammar
# ---------------------------------------------------------------------------------------------

_LITERAL_RE = re.compile(r"([0-9]*)(?:\.([0-9]*))?(?:[eE]([+-]?[0-9]+))?")


def _check_size(x: Fraction) -> Fraction:
    """Refuse results too large to be a sensible answer (bounds time and memory)."""
    if x.numerator.bit_length() > _MAX_BITS or x.denominator.bit_length() > _MAX_BITS:
        raise _Refused("number too large")
    return x


class _Parser:
    """Recursive-descent evaluator of numbers, + - * /, ^ (integer exponents), parentheses,
    braces and \\frac{a}{b} / \\frac12, over a normalized answer (no whitespace).

        expr  := term (("+" | "-") term)*
        term  := unary (("*" | "/") unary)*
        unary := ("+" | "-")* power
        power := atom ("^" unary)?          -- right associative, -2^2 == -(2^2)
        atom  := number | "(" expr ")" | "{" expr "}" | "\\frac" arg arg
    """

    def __init__(self, text: str):
        self.s = text
        self.i = 0
        self.depth = 0

    def parse(self) -> Fraction | None:
        value = self.expr()
        return value if value is not None and self.i == len(self.s) else None

    def peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def enter(self) -> None:
        self.depth += 1
        if self.depth > 3 * _MAX_DEPTH:
            raise _Refused("expression too deep")

    def expr(self) -> Fraction | None:
        self.enter()
        value = self.term()
        while value is not None and self.peek() in ("+", "-"):
            op = self.s[self.i]
            self.i += 1
            rhs = self.term()
            if rhs is None:
                return None
            value = _check_size(value + rhs if op == "+" else value - rhs)
        self.depth -= 1
        return value

    def term(self) -> Fraction | None:
        value = self.unary()
        while value is not None and self.peek() in ("*", "/"):
            op = self.s[self.i]
            self.i += 1
            rhs = self.unary()
            if rhs is None or (op == "/" and rhs == 0):
                return None
            value = _check_size(value * rhs if op == "*" else value / rhs)
        return value

    def unary(self) -> Fraction | None:
        sign = 1
        while self.peek() in ("+", "-"):  # iterative: "------5" costs no stack
            sign = -sign if self.s[self.i] == "-" else sign
            self.i += 1
        value = self.power()
        return None if value is None else sign * value

    def power(self) -> Fraction | None:
        base = self.atom()
        if base is None or self.peek() != "^":
            return base
        self.i += 1
        self.enter()
        exponent = self.unary() if self.peek() != "{" else self.atom()
        self.depth -= 1
        if exponent is None or exponent.denominator != 1:
            return None
        return _bounded_power(base, exponent.numerator)

    def atom(self) -> Fraction | None:
        c = self.peek()
        if c in ("(", "{"):
            self.i += 1
            value = self.expr()
            if value is None or self.peek() != (")" if c == "(" else "}"):
                return None
            self.i += 1
            return value
        if self.s.startswith("\\frac", self.i):
            self.i += len("\\frac")
            num = self.frac_arg()
            den = self.frac_arg() if num is not None else None
            if den is None or den == 0:
                return None
            return _check_size(num / den)
        if c.isascii() and (c.isdigit() or c == "."):
            return self.number()
        return None

    def frac_arg(self) -> Fraction | None:
        """A braced expression or, as in "\\frac12", a single digit."""
        c = self.peek()
        if c == "{":
            return self.atom()
        if c.isascii() and c.isdigit():
            self.i += 1
            return Fraction(int(c))
        return None

    def number(self) -> Fraction | None:
        m = _LITERAL_RE.match(self.s, self.i)
        whole, frac, exp = m.group(1), m.group(2) or "", m.group(3)
        if not whole and not frac:
            return None
        if len(whole) + len(frac) > _MAX_DIGITS:
            raise _Refused("literal too long")
        self.i = m.end()
        value = Fraction(int(whole or "0") * 10 ** len(frac) + int(frac or "0"), 10 ** len(frac))
        if exp is not None:
            if len(exp) > 6 or abs(int(exp)) * 4 > _MAX_BITS:
                raise _Refused("scientific exponent too large")
            value *= Fraction(10) ** int(exp)
        return _check_size(value)


def _bounded_power(base: Fraction, exponent: int) -> Fraction | None:
    """base ** exponent, refused when the result would exceed _MAX_BITS."""
    if base == 0:
        return None if exponent < 0 else Fraction(0 if exponent else 1)
    if abs(base.numerator) == 1 and base.denominator == 1:
        return base if exponent % 2 else Fraction(1)
    size = max(base.numerator.bit_length(), base.denominator.bit_length())
    if abs(exponent) > _MAX_BITS or size * abs(exponent) > _MAX_BITS:
        raise _Refused("power too large")
    return _check_size(base**exponent)


def parse_number(s: str) -> Fraction | None:
    """The exact value of a normalized numeric answer, or None if it is not one. Raises _Refused
    when a bound is hit."""
    if not s or len(s) > _HARD_MAX_CHARS:
        return None
    return _Parser(s).parse()


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def builtin_verify(response: str, reference: str, max_answer_chars: int) -> bool:
    """Whether the final answer of a model response equals the reference answer (a bare answer,
    or a text with a \\boxed{} answer), by this module's rules. Answers longer than
    max_answer_chars are wrong. Never raises: any internal error counts as wrong."""
    try:
        answer = extract_answer(response, max_chars=max_answer_chars)
        if answer is None:
            return False
        ref = extract_answer(reference) if "\\boxed" in reference else reference
        return ref is not None and answers_equivalent(answer, ref)
    except Exception:  # untrusted input: a bug here must not crash training
        return False
