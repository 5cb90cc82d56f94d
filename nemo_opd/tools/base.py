"""The tool interface: a name, a JSON schema of its arguments, and a call that returns text.

A tool is any object with

    name: str           what the model writes to call it
    description: str    one line the chat template shows the model
    parameters: dict    the JSON schema of its arguments (an object)
    __call__(arguments: dict) -> str

and optionally warm_up() (imports and caches, run once when its worker starts). It runs in a
tool worker process (nemo_opd.tools.pool), never in the driver: its arguments are checked
against `parameters` first, and it may raise ToolError(message) to refuse a call, the message
being what the model reads. A tool is named in the config by its built-in name ("calculator")
or as "package.module:attribute", a class or function called with no arguments (or an
object) that gives the tool; the worker imports it the same way.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

BUILTIN_TOOLS = {"calculator": "nemo_opd.tools.calculator:Calculator"}
"""Tools nemo_opd ships, by the name the config gives them."""

ERROR_KINDS = (
    "malformed",
    "unknown_tool",
    "too_many_calls",
    "bad_arguments",
    "failed",
    "memory",
    "timeout",
    "budget",
    "output_too_large",
    "crash",
)
"""How a call can fail, each counted in the metrics (env/<task>/tool_error/<kind>):
malformed (the call could not be read: bad JSON, no name, cut short, too long, nested too
deeply), unknown_tool, too_many_calls (past tools.max_calls_per_turn in one turn),
bad_arguments (not what the tool's schema asks for), failed (the tool refused or raised),
memory (the worker's memory limit), timeout (the call ran past the time limit and its worker
was killed), budget (not run, or stopped, because its turn's or its step's time for tool calls
ran out: tools.turn_budget_s, tools.step_budget_s), output_too_large (past
tools.max_output_chars), crash (the worker died)."""


class ToolError(Exception):
    """A call the tool refuses; its message is what the model reads."""


@runtime_checkable
class Tool(Protocol):
    """A tool the model can call (module docstring)."""

    name: str
    description: str
    parameters: dict

    def __call__(self, arguments: dict) -> str: ...


@dataclass(frozen=True)
class ToolCall:
    """A call as the model wrote it: the tool's name and its arguments."""

    name: str
    arguments: dict


@dataclass(frozen=True)
class ToolResult:
    """What the model reads back, and whether the call failed (error: one of ERROR_KINDS, or
    None)."""

    content: str
    error: str | None = None


def tool_schema(tool: Tool) -> dict:
    """The tool as chat templates take it (`tools=`, the OpenAI function format)."""
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def load_tool(spec: str) -> Tool:
    """The tool a config names: a built-in name or "package.module:attribute" (module
    docstring). Raises ValueError for a spec that names nothing usable."""
    target = BUILTIN_TOOLS.get(spec, spec)
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        known = ", ".join(sorted(BUILTIN_TOOLS))
        raise ValueError(f"tool {spec!r}: expected one of {known} or 'package.module:attribute'")
    try:
        made = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as error:
        raise ValueError(f"tool {spec!r}: cannot import {target!r} ({error})") from error
    tool = made
    if isinstance(made, type) or not isinstance(made, Tool):
        try:
            tool = made()
        except TypeError as error:
            raise ValueError(f"tool {spec!r}: cannot call {target!r} ({error})") from error
    if isinstance(tool, type) or not isinstance(tool, Tool):
        raise ValueError(f"tool {spec!r}: {target!r} has no name, description, parameters and call")
    return tool


def tool_schemas(specs: list[str]) -> list[dict] | None:
    """The tools a config names as chat templates take them, or None for none; ValueError
    for a spec that names no tool."""
    return [tool_schema(load_tool(spec)) for spec in specs] or None
