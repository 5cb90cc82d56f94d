"""The calculator tool: exact arithmetic and sympy simplification of one expression.

The expression is read by Python's own parser (ast.parse, which builds a tree and runs
nothing) and the tree is turned into a sympy expression node by node, accepting only numbers,
names (symbols and the constants pi, E, I), + - * / // % ** (and ^ for **), unary signs and
calls of a short list of sympy functions. Nothing is evaluated as Python: no eval, no
sympy.sympify or parse_expr (which eval their input). Numbers are exact: "0.1" is 1/10.

Bounds (a refusal is a ToolError the model reads): the expression's length and node count,
a literal's digits, the size of a power of numbers, of an exp() and of a binomial coefficient
(its result's bits, estimated before it is computed, whatever the numbers: an exponent that is
a fraction, a base that is a root), a factorial's argument; results longer than Python's
integer-to-text limit fail when written. Anything else that runs long or large (simplify on
a hostile expression) is stopped by the worker's time and memory limits and the pool's
budgets (nemo_opd.tools.pool).

    calculate("123 * 45 + 7/3")          -> "16612/3 ≈ 5537.33333333333"
    calculate("(x**2 - 1)/(x - 1)")      -> "x + 1"
"""

from __future__ import annotations

import ast
import math

from nemo_opd.tools.base import ToolError

MAX_EXPRESSION_CHARS = 1000
MAX_NODES = 400
MAX_LITERAL_DIGITS = 1000
MAX_POWER_BITS = 14_000
"""A power of numbers (or an exp(), or a binomial coefficient) whose result would need more
bits (about 4,200 digits, near Python's limit on writing an integer as text) is refused before
it is computed. The estimate: |exponent| times log2 of the largest integer written in the
base (at least 1 bit: a power of pi or sqrt(2) counts as one of 2)."""
MAX_FACTORIAL = 1000
MAX_NAME_CHARS = 24
APPROX_DIGITS = 15

_FUNCTIONS = {
    "sqrt": "sqrt",
    "cbrt": "cbrt",
    "exp": "exp",
    "log": "log",
    "ln": "log",
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "abs": "Abs",
    "floor": "floor",
    "ceiling": "ceiling",
    "factorial": "factorial",
    "binomial": "binomial",
    "gcd": "gcd",
    "lcm": "lcm",
}
"""Names the expression may call -> the sympy function."""
_CONSTANTS = {"pi": "pi", "E": "E", "I": "I"}
_TEXT_OPERATORS = {"^": "**", "×": "*", "÷": "/", "−": "-"}


class Calculator:
    """The calculator as a tool (nemo_opd.tools.base): arguments {"expression": str}."""

    name = "calculator"
    description = "Exact arithmetic and simplification of one expression, e.g. 12 * (3 + 4)."
    parameters = {
        "type": "object",
        "properties": {
            "expression": {
                "type": "string",
                "description": "numbers, + - * / ** ( ), sqrt, log, sin, ...; symbols allowed",
            }
        },
        "required": ["expression"],
        "additionalProperties": False,
    }

    def warm_up(self) -> None:
        calculate("1 + 1")  # imports sympy before the first call's clock starts

    def __call__(self, arguments: dict) -> str:
        return calculate(arguments["expression"])


def calculate(expression: str) -> str:
    """The simplified value of `expression` as text (module docstring); ToolError when the
    expression is refused or cannot be computed."""
    import sympy

    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    for written, python in _TEXT_OPERATORS.items():
        expression = expression.replace(written, python)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise ToolError(f"cannot read the expression: {_first_line(error)}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise ToolError(f"the expression has more than {MAX_NODES} parts")
    try:
        value = sympy.simplify(_to_sympy(tree.body, sympy))
        return _as_text(value, sympy)
    except ToolError:
        raise
    except (ValueError, TypeError, ArithmeticError, AttributeError, RecursionError) as error:
        raise ToolError(f"cannot compute it: {_first_line(error)}") from None


def _to_sympy(node: ast.AST, sympy):
    """The sympy expression of one parsed node (module docstring for what is accepted)."""
    if isinstance(node, ast.Constant):
        return _number(node.value, sympy)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        operand = _to_sympy(node.operand, sympy)
        return -operand if isinstance(node.op, ast.USub) else operand
    if isinstance(node, ast.BinOp):
        return _binary(node, sympy)
    if isinstance(node, ast.Name):
        return _name(node.id, sympy)
    if isinstance(node, ast.Call):
        return _call(node, sympy)
    raise ToolError(f"unsupported in an expression: {type(node).__name__}")


def _number(value, sympy):
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ToolError(f"not a number: {str(value)[:40]!r}")
    if isinstance(value, int):
        if value.bit_length() > MAX_LITERAL_DIGITS * 4:
            raise ToolError(f"a number has more than {MAX_LITERAL_DIGITS} digits")
        return sympy.Integer(value)
    if not math.isfinite(value):
        raise ToolError("a number is too large")
    return sympy.Rational(repr(value))  # the literal as written: 0.1 is 1/10


def _binary(node: ast.BinOp, sympy):
    left, right = _to_sympy(node.left, sympy), _to_sympy(node.right, sympy)
    op = node.op
    if isinstance(op, ast.Add):
        return left + right
    if isinstance(op, ast.Sub):
        return left - right
    if isinstance(op, ast.Mult):
        return left * right
    if isinstance(op, ast.Div):
        return left / right
    if isinstance(op, ast.FloorDiv):
        return sympy.floor(left / right)
    if isinstance(op, ast.Mod):
        return sympy.Mod(left, right)
    if isinstance(op, ast.Pow):
        _check_power(left, right, sympy)
        return left**right
    raise ToolError(f"unsupported operator: {type(op).__name__}")


def _check_power(base, exponent, sympy) -> None:
    """Refuse a power of numbers whose result could need more than MAX_POWER_BITS bits
    (MAX_POWER_BITS for the estimate); a power with a symbol in it is left to sympy, which
    keeps it as it is."""
    if not (base.is_number and exponent.is_number) or base in (0, 1, -1, sympy.I, -sympy.I):
        return
    if _magnitude(exponent, sympy) * _bits_per_unit(base, sympy) > MAX_POWER_BITS:
        raise ToolError("the result of a power is too large")


def _check_binomial(n, k, sympy) -> None:
    """Refuse binomial(n, k) of numbers past MAX_POWER_BITS: about min(k, n - k) factors of
    n's size each."""
    if not (n.is_number and k.is_number):
        return
    factors = _magnitude(k, sympy)
    if n.is_Integer and k.is_Integer:
        factors = min(factors, _magnitude(n - k, sympy))
    if factors * max(1.0, _bits_per_unit(n, sympy)) > MAX_POWER_BITS:
        raise ToolError("the binomial coefficient is too large")


def _magnitude(value, sympy) -> float:
    """|value| of a number, capped just past MAX_POWER_BITS (enough to refuse): exact for a
    rational, else evaluated to a few digits (its parts passed these checks, so it is not
    huge to evaluate)."""
    cap = MAX_POWER_BITS + 1
    if value.is_Rational:
        return float(min(abs(value), cap))
    magnitude = sympy.Abs(value).evalf(5)
    if not magnitude.is_Float:  # infinite, undefined, or not evaluated
        return float(cap)
    return min(float(magnitude), float(cap))


def _bits_per_unit(base, sympy) -> float:
    """log2 of the largest integer written in `base` (numerators and denominators), at least
    1: the bits its power grows by per unit of the exponent, or more."""
    largest = max((max(abs(r.p), abs(r.q)) for r in base.atoms(sympy.Rational)), default=2)
    return max(1.0, math.log2(largest))


def _name(name: str, sympy):
    if name in _CONSTANTS:
        return getattr(sympy, _CONSTANTS[name])
    if name in _FUNCTIONS or name.startswith("_") or len(name) > MAX_NAME_CHARS:
        raise ToolError(f"{name!r} cannot be a variable")
    return sympy.Symbol(name)


def _call(node: ast.Call, sympy):
    name = node.func.id if isinstance(node.func, ast.Name) else None
    if name not in _FUNCTIONS or node.keywords or not 1 <= len(node.args) <= 2:
        shown = name or type(node.func).__name__
        raise ToolError(f"unsupported call: {shown} (known: {', '.join(sorted(_FUNCTIONS))})")
    args = [_to_sympy(arg, sympy) for arg in node.args]
    if name == "factorial" and args[0].is_Number and abs(args[0]) > MAX_FACTORIAL:
        raise ToolError(f"factorial of more than {MAX_FACTORIAL}")
    if name == "exp":
        _check_power(sympy.E, args[0], sympy)
    if name == "binomial" and len(args) == 2:
        _check_binomial(*args, sympy)
    return getattr(sympy, _FUNCTIONS[name])(*args)


def _as_text(value, sympy) -> str:
    """The exact result, with a decimal approximation when it is a number that is not
    rational (sqrt(2) ≈ 1.41421356237310) or a fraction."""
    if value.has(sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        raise ToolError("the result is undefined or infinite (a division by zero?)")
    try:
        text = str(value)
    except ValueError:  # Python's limit on an integer's digits as text
        raise ToolError("the result has too many digits to write") from None
    if value.is_number and not value.is_Integer and value.is_finite:
        approx = sympy.N(value, APPROX_DIGITS)
        if approx.is_real:
            text += f" ≈ {approx}"
    return text


def _first_line(error: BaseException) -> str:
    text = str(error).split("\n", 1)[0] or type(error).__name__
    return text[:200]
