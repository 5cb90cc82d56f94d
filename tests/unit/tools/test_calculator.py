"""The calculator: exact answers, sympy simplification, and refusals (never Python's eval)."""

import pytest

from nemo_opd.tools import ToolError, load_tool
from nemo_opd.tools.calculator import MAX_EXPRESSION_CHARS, Calculator, calculate

EXACT = {
    "12 + 345": "357",
    "7 * 12 - 3": "81",
    "2^10": "1024",
    "2 ** -2": "1/4 ≈ 0.250000000000000",
    "0.1 + 0.2": "3/10 ≈ 0.300000000000000",
    "10 // 3": "3",
    "10 % 3": "1",
    "(x**2 - 1)/(x - 1)": "x + 1",
    "sqrt(8)": "2*sqrt(2) ≈ 2.82842712474619",
    "sin(pi/6)": "1/2 ≈ 0.500000000000000",
    "factorial(10)": "3628800",
    "log(8, 2)": "3",
    "12 × 3 ÷ 4": "9",
    "99999999999999999999 * 99999999999999999999": str(99999999999999999999**2),
}


@pytest.mark.parametrize("expression", list(EXACT))
def test_exact_results(expression):
    assert calculate(expression) == EXACT[expression]


REFUSED = {
    "__import__('os').system('true')": "unsupported call",
    "(1).__class__": "unsupported in an expression",
    "lambda: 1": "unsupported in an expression",
    "[1, 2]": "unsupported in an expression",
    "'text'": "not a number",
    "open('/etc/passwd')": "unsupported call",
    "sqrt(x=4)": "unsupported call",
    "_secret + 1": "cannot be a variable",
    "1 +": "cannot read the expression",
    "2 ** (2 ** 20)": "too large",
    "(2 ** 9000) ** 2": "too large",
    "factorial(10**6)": "factorial of more than",
    "7**4000 * 7**4000": "too many digits",
    "1/0": "undefined or infinite",
    "1 << 5": "unsupported operator",
    "(" * 300 + "1" + ")" * 300: "cannot read the expression",
    "1+" * 600 + "1": "longer than",
}


@pytest.mark.parametrize("expression", list(REFUSED))
def test_refusals_are_tool_errors(expression):
    with pytest.raises(ToolError, match=REFUSED[expression]):
        calculate(expression)


def test_too_many_parts_is_refused():
    expression = "+".join(["1"] * 300)  # shorter than the limit, more nodes than allowed
    assert len(expression) < MAX_EXPRESSION_CHARS
    with pytest.raises(ToolError, match="more than"):
        calculate(expression)


def test_the_tool_by_its_config_name():
    tool = load_tool("calculator")
    assert isinstance(tool, Calculator)
    assert tool({"expression": "6 * 7"}) == "42"
    assert tool.parameters["required"] == ["expression"]


def test_load_tool_refuses_what_names_nothing():
    with pytest.raises(ValueError, match="expected one of calculator"):
        load_tool("no_such_tool")
    with pytest.raises(ValueError, match="cannot import"):
        load_tool("nemo_opd.tools.calculator:NoSuchThing")
    with pytest.raises(ValueError, match="cannot call"):
        load_tool("nemo_opd.tools.calculator:calculate")
    with pytest.raises(ValueError, match="has no name"):
        load_tool("json:JSONDecoder")
