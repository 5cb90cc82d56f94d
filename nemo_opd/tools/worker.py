"""A tool worker process: runs one call at a time for nemo_opd.tools.pool.ToolPool.

    python -m nemo_opd.tools.worker --tool calculator [--tool pkg.mod:attr ...] \\
        --memory-mb 1024 --max-output-chars 4096 --parent PID

Protocol, one JSON line each way on stdin / stdout: it writes "ready" once its tools are
loaded and warmed up, then reads {"name": str, "arguments": object} and answers
{"content": str, "error": null or one of tools.base.ERROR_KINDS}. Anything the tools print
goes to stderr, so it cannot corrupt a reply.

Guards (nemo_opd.utils.worker_guards): its address space is capped at --memory-mb (an
allocation past it is a "memory" error, and the worker goes on), the files it writes (its
stderr included) at FILE_LIMIT_MB, both hard limits that a tool cannot raise; it dies with its
parent and runs in a session of its own, with the minimal environment its pool gives it.
The arguments are checked against the tool's JSON schema (jsonschema) before the tool runs; an
output longer than --max-output-chars is not sent. The time limit is the pool's: it kills a
worker whose call overruns.
"""

import argparse
import json
import sys

import jsonschema

from nemo_opd.tools.base import Tool, ToolError, load_tool
from nemo_opd.utils.worker_guards import (
    die_with_parent,
    limit_file_size,
    limit_memory,
    protocol_stream,
)

FILE_LIMIT_MB = 16
MESSAGE_CHARS = 300
"""Longest error message sent back (a schema error can quote the whole argument)."""


def run_call(tools: dict[str, Tool], validators: dict, request: dict, max_output_chars: int):
    """The reply to one request: {"content": str, "error": kind or None}."""
    name, arguments = request["name"], request["arguments"]
    if name not in tools:
        return _failure("unknown_tool", f"there is no tool named {name!r}")
    problem = next(iter(validators[name].iter_errors(arguments)), None)
    if problem is not None:
        return _failure("bad_arguments", f"bad arguments for {name}: {problem.message}")
    try:
        content = tools[name](arguments)
    except ToolError as error:
        return _failure("failed", str(error))
    except MemoryError:
        return _failure("memory", f"{name} ran out of memory")
    except Exception as error:  # a tool's bug must not end the worker
        return _failure("failed", f"{name} failed: {type(error).__name__}: {error}")
    if not isinstance(content, str):
        return _failure("failed", f"{name} returned {type(content).__name__}, not text")
    if len(content) > max_output_chars:
        limit = f"the limit of {max_output_chars}"
        return _failure("output_too_large", f"{name} wrote {len(content)} characters, past {limit}")
    return {"content": content, "error": None}


def _failure(kind: str, message: str) -> dict:
    return {"content": f"Error: {message[:MESSAGE_CHARS]}", "error": kind}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tool", action="append", required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--max-output-chars", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    limit_memory(args.memory_mb)
    limit_file_size(FILE_LIMIT_MB)
    out = protocol_stream()
    tools = {tool.name: tool for tool in map(load_tool, args.tool)}
    validators = {name: jsonschema.Draft202012Validator(t.parameters) for name, t in tools.items()}
    for tool in tools.values():
        if hasattr(tool, "warm_up"):
            tool.warm_up()
    out.write(b'"ready"\n')
    for line in sys.stdin.buffer:
        try:
            reply = run_call(tools, validators, json.loads(line), args.max_output_chars)
        except MemoryError:
            reply = _failure("memory", "the call ran out of memory")
        out.write(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    main()
