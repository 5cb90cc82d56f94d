"""Reading tool calls out of an assistant turn, in the format its model family writes them.

- hermes (Qwen2.5, Qwen3, Hermes, and the tiny tool task): each call is a JSON object
  {"name": ..., "arguments": {...}} between <tool_call> and </tool_call>, several per turn
  allowed; text around them is kept as the turn's content.
- llama3_json (Llama 3.1 / 3.2 / 3.3 with JSON tool calling): the whole turn (after the
  <|python_tag|> special token, which decoding drops) is one JSON object {"name": ...,
  "parameters": {...}} ("arguments" is read too), or several separated by ";".

A turn with no call attempt is an answer (None). A call that cannot be read (bad JSON, no
name, arguments that are not an object, a <tool_call> never closed, a call longer than
max_call_chars or nested deeper than MAX_DEPTH) is still a call: it comes back as a
ParsedCall with its error, which the model reads as the tool's reply. The text is untrusted:
every call's length and bracket depth are checked before json.loads sees it, in one pass over
the turn, so the work is linear in the turn's length.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass

MAX_DEPTH = 32
"""Deepest bracket nesting of a call's JSON (a real call needs a handful)."""

HERMES_OPEN, HERMES_CLOSE = "<tool_call>", "</tool_call>"
_HERMES_RE = re.compile(re.escape(HERMES_OPEN) + r"(.*?)(" + re.escape(HERMES_CLOSE) + r"|$)", re.S)


@dataclass(frozen=True)
class ParsedCall:
    """One call attempt: name and arguments when it could be read, else error (what the model
    reads) with name possibly known."""

    name: str | None = None
    arguments: dict | None = None
    error: str | None = None


Parser = Callable[[str, int], "list[ParsedCall] | None"]
"""(assistant text, max_call_chars) -> the turn's call attempts, or None for an answer."""


def parse_hermes(text: str, max_call_chars: int) -> list[ParsedCall] | None:
    """The <tool_call> blocks of a turn (module docstring)."""
    if HERMES_OPEN not in text:
        return None
    calls = []
    for match in _HERMES_RE.finditer(text):
        body, closed = match.group(1), bool(match.group(2))
        if not closed:
            calls.append(ParsedCall(error=f"the call has no closing {HERMES_CLOSE}"))
        else:
            calls.append(read_call(body, max_call_chars, "arguments"))
    return calls


def parse_llama3_json(text: str, max_call_chars: int) -> list[ParsedCall] | None:
    """The JSON call(s) making up a whole turn (module docstring)."""
    body = text.strip()
    if not body.startswith("{"):
        return None
    if len(body) > max_call_chars:
        return [ParsedCall(error=_too_long(max_call_chars))]
    calls, at, decoder = [], 0, json.JSONDecoder()
    deep_until = last_too_deep(body)
    while at < len(body):
        if at <= deep_until:  # the rest nests deeper than MAX_DEPTH somewhere
            return [*calls, ParsedCall(error=_too_deep())]
        try:
            value, end = decoder.raw_decode(body, at)
        except (ValueError, RecursionError):
            return [*calls, ParsedCall(error="the call is not valid JSON")]
        calls.append(call_from_json(value, "parameters"))
        at = end
        while at < len(body) and body[at] in " \t\r\n;":
            at += 1
    return calls


PARSERS: dict[str, Parser] = {"hermes": parse_hermes, "llama3_json": parse_llama3_json}
"""tools.format -> its parser."""


def read_call(body: str, max_call_chars: int, arguments_key: str) -> ParsedCall:
    """One call's JSON text (bounded before it is parsed)."""
    body = body.strip()
    if len(body) > max_call_chars:
        return ParsedCall(error=_too_long(max_call_chars))
    if bracket_depth(body) > MAX_DEPTH:
        return ParsedCall(error=_too_deep())
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return ParsedCall(error="the call is not valid JSON")
    return call_from_json(value, arguments_key)


def call_from_json(value, arguments_key: str) -> ParsedCall:
    """A decoded call: {"name": str, arguments_key or "arguments": object (or JSON text of
    one)}."""
    if not isinstance(value, dict):
        return ParsedCall(error='a call is a JSON object {"name": ..., "arguments": {...}}')
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return ParsedCall(error='the call has no "name"')
    arguments = value.get(arguments_key, value.get("arguments", {}))
    if isinstance(arguments, str):  # some models write the arguments as JSON text
        try:
            arguments = json.loads(arguments) if bracket_depth(arguments) <= MAX_DEPTH else None
        except (ValueError, RecursionError):
            arguments = None
    if not isinstance(arguments, dict):
        return ParsedCall(name=name, error="the arguments are not a JSON object")
    return ParsedCall(name=name, arguments=arguments)


def bracket_depth(text: str) -> int:
    """Deepest nesting of [ and { in text (strings included: an over-count only refuses
    sooner)."""
    depth = deepest = 0
    for char in text:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth = max(0, depth - 1)
    return deepest


def last_too_deep(text: str) -> int:
    """The last index of text where the nesting of [ and { passes MAX_DEPTH, counted from the
    start as bracket_depth counts (-1 if it never does): one pass for a whole turn, where
    bracket_depth of the rest before each call would be quadratic in the calls. The count from
    a later start is never higher, so the calls after that index nest no deeper than
    MAX_DEPTH; those at or before it are refused (as bracket_depth of the rest would refuse
    them where earlier calls' brackets balance; brackets in strings can only refuse sooner)."""
    depth, last = 0, -1
    for index, char in enumerate(text):
        if char in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                last = index
        elif char in "]}":
            depth = max(0, depth - 1)
    return last


def _too_long(limit: int) -> str:
    return f"the call is longer than {limit} characters"


def _too_deep() -> str:
    return f"the call is nested deeper than {MAX_DEPTH} levels"
