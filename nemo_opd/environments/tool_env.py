"""An environment with tools: a turn that calls tools gets their results; any other turn is
graded by the environment it wraps.

Each step reads the last assistant turn of every conversation in the format its model family
writes calls (nemo_opd.tools.parsers). A turn with call attempts is a tool turn: each of its
first max_calls_per_turn attempts gets one `tool` message (its result, or "Error: ..." for a
call that could not be read, names no tool, has bad arguments, fails, or overruns a limit or
a budget), and the attempts past them one message between them all (an error: they are not
run), so a turn's reply is bounded however many calls it writes. The episode goes on (done
False, reward 0) and the messages are the reply, which the rollout loop appends before the
next assistant turn. The calls of the whole batch run in one ToolPool.run, in worker processes
with time, memory and output limits and per-turn and per-step time budgets
(nemo_opd.tools.pool). A turn without a call is an answer, graded by the inner environment
(batched over those rows).

The messages carry model text only as text: a message is named after its tool only when the
call names an offered tool, and a result's lone surrogates (not text) are replaced; the
chat formatter reads tool contents' control strings as text (nemo_opd.data.chat).

The rollout's turn and token budgets (distillation.max_rollout_turns, max_seq_len) end an
episode that keeps calling, or whose reply would not fit; its reward is then 0.

Metrics (counts per step, which the rollout sums over turns as env/<task>/<name>): the inner
environment's, and tool_calls (attempts), tool_turns (turns with an attempt),
tool_using_rollouts (episodes making their first call), tool_errors and tool_error/<kind>
(tools.base.ERROR_KINDS). Each episode's metadata counts its "tool_calls" and "tool_errors".
"""

from __future__ import annotations

from dataclasses import dataclass

from nemo_opd.data.message_log import Message
from nemo_opd.environments.base import Environment, EnvironmentStep
from nemo_opd.tools.base import ToolCall, ToolResult
from nemo_opd.tools.parsers import ParsedCall, Parser
from nemo_opd.tools.pool import ToolPool


@dataclass(frozen=True)
class ToolLimits:
    """What a turn may ask for: call text length (max_call_chars, checked before parsing) and
    calls per turn (the rest are not run, and one message answers them all)."""

    max_call_chars: int
    max_calls_per_turn: int


class ToolEnvironment:
    """Tools around an environment (module docstring).

    Args:
        inner: grades the turns that call no tool.
        pool: runs the calls.
        tool_names: the tools offered (a call naming another is an unknown_tool error).
        parse: the model family's call format (tools.parsers.PARSERS).
        limits: per-turn limits.
    """

    def __init__(
        self,
        inner: Environment,
        pool: ToolPool,
        tool_names: list[str],
        parse: Parser,
        limits: ToolLimits,
    ):
        self.inner = inner
        self.pool = pool
        self.tool_names = set(tool_names)
        self.parse = parse
        self.limits = limits

    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvironmentStep:
        """Tool results for the turns that call tools, the inner environment's step for the
        others (module docstring)."""
        attempts = [
            self.parse(last_assistant_text(log), self.limits.max_call_chars) for log in message_logs
        ]
        answered = [i for i, calls in enumerate(attempts) if calls is None]
        calling = [i for i, calls in enumerate(attempts) if calls is not None]
        step = EnvironmentStep(
            rewards=[0.0] * len(message_logs),
            done=[False] * len(message_logs),
            next_messages=[None] * len(message_logs),
            metadata=[dict(meta) for meta in metadata],
        )
        if answered:
            self._grade_answers(step, message_logs, metadata, answered)
        results = self._results([attempts[i] for i in calling])
        step.metrics.update(tool_metrics(results, [metadata[i] for i in calling]))
        for i, outcome in zip(calling, results, strict=True):
            step.next_messages[i] = self._messages(attempts[i], outcome)
            errors = sum(result.error is not None for result in outcome)
            meta = step.metadata[i]
            meta["tool_calls"] = int(meta.get("tool_calls", 0)) + len(outcome)
            meta["tool_errors"] = int(meta.get("tool_errors", 0)) + errors
        return step

    def _grade_answers(
        self, step: EnvironmentStep, logs: list, metadata: list[dict], rows: list[int]
    ) -> None:
        """The inner environment's step for `rows`, placed into `step`."""
        inner = self.inner.step([logs[i] for i in rows], [metadata[i] for i in rows])
        for j, i in enumerate(rows):
            step.rewards[i], step.done[i] = inner.rewards[j], inner.done[j]
            step.next_messages[i], step.metadata[i] = inner.next_messages[j], inner.metadata[j]
        step.metrics.update(inner.metrics)

    def _results(self, turns: list[list[ParsedCall]]) -> list[list[ToolResult]]:
        """Each turn's results: the errors found before running, the pool's results for the
        calls it runs (all of the batch at once)."""
        results: list[list[ToolResult | None]] = []
        runnable: list[tuple[int, int, ToolCall]] = []
        for t, calls in enumerate(turns):
            results.append([])
            for c, call in enumerate(calls):
                error = self._refusal(call, c)
                results[t].append(error)
                if error is None:
                    runnable.append((t, c, ToolCall(call.name, call.arguments)))
        if runnable:
            calls = [call for _, _, call in runnable]
            ran = self.pool.run(calls, turns=[t for t, _, _ in runnable])
            for (t, c, _), result in zip(runnable, ran, strict=True):
                results[t][c] = result
        return results

    def _refusal(self, call: ParsedCall, index: int) -> ToolResult | None:
        """The error of a call that is not run (too many calls, malformed, unknown tool)."""
        if index >= self.limits.max_calls_per_turn:
            limit = self.limits.max_calls_per_turn
            return ToolResult(f"Error: at most {limit} calls per turn", "too_many_calls")
        if call.error is not None:
            return ToolResult(f"Error: {call.error}", "malformed")
        if call.name not in self.tool_names:
            known = ", ".join(sorted(self.tool_names))
            return ToolResult(
                f"Error: no tool named {call.name[:80]!r} (tools: {known})", "unknown_tool"
            )
        return None

    def _messages(self, calls: list[ParsedCall], results: list[ToolResult]) -> list[Message]:
        """A turn's reply: a message per call up to max_calls_per_turn, then one for the rest
        (module docstring)."""
        limit = self.limits.max_calls_per_turn
        messages = [
            tool_message(result, call.name if call.name in self.tool_names else None)
            for call, result in zip(calls[:limit], results[:limit], strict=True)
        ]
        extra = len(calls) - limit
        if extra > 0:
            were = "was" if extra == 1 else "were"
            content = f"Error: at most {limit} calls per turn: {extra} more {were} not run"
            messages.append(tool_message(ToolResult(content, "too_many_calls"), None))
        return messages

    def shutdown(self) -> None:
        """Stop the tool workers and the inner environment (safe to call twice)."""
        self.pool.close()
        self.inner.shutdown()


def last_assistant_text(log: list[Message]) -> str:
    """The content of the conversation's last assistant turn ("" if there is none)."""
    for message in reversed(log):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def tool_message(result: ToolResult, name: str | None) -> Message:
    """The `tool` message that carries a call's result, named after its tool (None: not
    named); lone surrogates (no character, which a tokenizer refuses) become "?"."""
    content = result.content.encode("utf-8", "replace").decode("utf-8")
    message = {"role": "tool", "content": content}
    if name is not None:
        message["name"] = name
    return message


def tool_metrics(results: list[list[ToolResult]], metadata: list[dict]) -> dict[str, float]:
    """The step's tool counts (module docstring): results per calling turn, with each turn's
    episode metadata before the step."""
    outcomes = [result for turn in results for result in turn]
    metrics = {
        "tool_calls": float(len(outcomes)),
        "tool_turns": float(len(results)),
        "tool_using_rollouts": float(sum(int(m.get("tool_calls", 0)) == 0 for m in metadata)),
        "tool_errors": float(sum(r.error is not None for r in outcomes)),
    }
    for result in outcomes:
        if result.error is not None:
            name = f"tool_error/{result.error}"
            metrics[name] = metrics.get(name, 0.0) + 1.0
    return metrics
