"""Tool calls read from assistant text in the Hermes/Qwen3 and Llama 3 JSON formats; every
malformed or hostile call is an error the model reads, read in time linear in its length."""

import json
import time

import pytest

from nemo_opd.tools import parsers
from nemo_opd.tools.parsers import MAX_DEPTH, ParsedCall, parse_hermes, parse_llama3_json

LIMIT = 1000


def hermes(body: str) -> str:
    return f"<tool_call>\n{body}\n</tool_call>"


def test_hermes_answer_has_no_call():
    assert parse_hermes("12 + 345 = 357. \\boxed{357}", LIMIT) is None


def test_hermes_calls_in_order():
    text = (
        "Let me compute.\n"
        + hermes('{"name": "calculator", "arguments": {"expression": "12 + 345"}}')
        + "\n"
        + hermes('{"name": "calculator", "arguments": "{\\"expression\\": \\"2 * 3\\"}"}')
    )
    assert parse_hermes(text, LIMIT) == [
        ParsedCall("calculator", {"expression": "12 + 345"}),
        ParsedCall("calculator", {"expression": "2 * 3"}),
    ]


MALFORMED = {
    "not json": (hermes('{"name": "calculator", "arguments": {'), "not valid JSON"),
    "no name": (hermes('{"arguments": {}}'), 'no "name"'),
    "a list": (hermes("[1, 2]"), "a JSON object"),
    "arguments a number": (hermes('{"name": "c", "arguments": 5}'), "not a JSON object"),
    "arguments bad text": (hermes('{"name": "c", "arguments": "{oops"}'), "not a JSON object"),
    "never closed": ('<tool_call>\n{"name": "calculator", "arguments": {}}', "no closing"),
    "huge": (hermes('{"name": "c", "arguments": {"e": "' + "9" * 10**6 + '"}}'), "longer than"),
    "deep": (hermes("[" * 400 + "]" * 400), "nested deeper"),
    "deep and huge": (hermes("[" * 10**5 + "]" * 10**5), "longer than"),
    "deep in arguments": (
        hermes('{"name": "c", "arguments": {"a": ' + "[" * 40 + "]" * 40 + "}}"),
        "nested deeper",
    ),
}


@pytest.mark.parametrize("case", list(MALFORMED))
def test_hermes_malformed_calls_are_errors(case):
    text, message = MALFORMED[case]
    [call] = parse_hermes(text, LIMIT)
    assert call.arguments is None and message in call.error


def test_llama3_json():
    assert parse_llama3_json("The answer is 4.", LIMIT) is None
    text = '{"name": "calculator", "parameters": {"expression": "12 + 345"}}'
    assert parse_llama3_json(text, LIMIT) == [ParsedCall("calculator", {"expression": "12 + 345"})]
    two = text + "; " + '{"name": "calculator", "arguments": {"expression": "1"}}'
    assert [c.arguments for c in parse_llama3_json(two, LIMIT)] == [
        {"expression": "12 + 345"},
        {"expression": "1"},
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"name": "calculator", "parameters": ', "not valid JSON"),
        ('{"parameters": {}}', 'no "name"'),
        ("{" + '"a":' * 10 + "1" + "}" * 10, "not valid JSON"),
        ('{"name": "c", "parameters": ' + "[" * (MAX_DEPTH + 5) + "]" * 40 + "}", "deeper"),
        ('{"name": "c", "parameters": {"e": "' + "1" * 5000 + '"}}', "longer than"),
    ],
)
def test_llama3_malformed_calls_are_errors(text, message):
    calls = parse_llama3_json(text, LIMIT)
    assert calls[-1].error is not None and message in calls[-1].error


def test_parsing_time_is_linear_in_the_text():
    """A turn of megabytes of half-open calls is read in well under a second."""
    text = ("<tool_call>{" + '"name": ' * 10) * 50_000
    started = time.perf_counter()
    calls = parse_hermes(text, LIMIT)
    assert time.perf_counter() - started < 2.0
    assert len(calls) == 1 and "no closing" in calls[0].error


def test_a_parsed_call_round_trips_through_json():
    body = json.dumps({"name": "x", "arguments": {"k": [1, {"a": None}]}})
    [call] = parse_hermes(hermes(body), LIMIT)
    assert call == ParsedCall("x", {"k": [1, {"a": None}]})


def test_llama3_depth_checks_read_a_turn_of_many_calls_once(monkeypatch):
    """2,048 calls `{}` in one turn: the nesting checks read each character a bounded number
    of times (checking the rest of the turn before each call read it ~2,048 times over)."""
    read = []
    for name in ("bracket_depth", "last_too_deep"):
        if hasattr(parsers, name):
            check = getattr(parsers, name)
            monkeypatch.setattr(
                parsers, name, lambda text, c=check: read.append(len(text)) or c(text)
            )
    text = "{}" * 2048
    calls = parse_llama3_json(text, len(text))
    assert len(calls) == 2048 and all('no "name"' in call.error for call in calls)
    assert sum(read) <= 2 * len(text)


def test_llama3_a_deep_call_is_refused_wherever_it_stands():
    good = '{"name": "c", "parameters": {"e": "1"}}'
    deep = '{"name": "c", "parameters": ' + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "}"
    assert parse_llama3_json(f"{good}; {good}", LIMIT) == [ParsedCall("c", {"e": "1"})] * 2
    calls = parse_llama3_json(f"{good}; {deep}", LIMIT)
    assert [call.error for call in calls] == [f"the call is nested deeper than {MAX_DEPTH} levels"]
    assert parse_llama3_json(f"{deep}; {good}", LIMIT) == calls
