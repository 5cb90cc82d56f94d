"""Tools the student can call during rollouts (docs/agentic.md).

- base.py: the tool interface (name, JSON schema of its arguments, a call that returns text),
  the call and result records, loading a tool by its config name;
- calculator.py: the calculator tool (exact arithmetic and sympy simplification, no eval);
- parsers.py: tool calls read from an assistant turn, per model family's format;
- pool.py, worker.py: calls run in worker processes with time, memory and output limits.

The environment that offers them to the model is nemo_opd.environments.tool_env.
"""

from nemo_opd.tools.base import (
    BUILTIN_TOOLS,
    ERROR_KINDS,
    Tool,
    ToolCall,
    ToolError,
    ToolResult,
    load_tool,
    tool_schema,
)

__all__ = [
    "BUILTIN_TOOLS",
    "ERROR_KINDS",
    "Tool",
    "ToolCall",
    "ToolError",
    "ToolResult",
    "load_tool",
    "tool_schema",
]
