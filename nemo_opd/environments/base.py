"""The environment interface: grade a batch of conversations, say which are done, and
optionally reply with a new user message (for example a request to try again)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:  # the message log module imports torch; grader workers import this package
    from nemo_opd.data.message_log import Message


@dataclass
class EnvironmentStep:
    """One environment step over a batch, one entry per conversation.

    rewards[i]: reward of the latest assistant turn of conversation i.
    done[i]: the episode is over (no further turn is wanted).
    next_messages[i]: the reply to append before the next assistant turn: a message (role
        "user"), a list of messages (tool results, role "tool"), or None.
    metadata[i]: the conversation's metadata after the step (passed back on the next step).
    metrics: counts over this step's batch (for math: answers graded, answered by the fast path,
        grader time-outs and crashes), summed over steps and logged as env/<task>/<name>.
    """

    rewards: list[float]
    done: list[bool]
    next_messages: list[Message | list[Message] | None]
    metadata: list[dict]
    metrics: dict[str, float] = field(default_factory=dict)


class Environment(Protocol):
    """Grades conversations. Model output is untrusted input."""

    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvironmentStep:
        """Grade the last assistant message of every conversation. metadata[i] carries what the
        environment needs (for math: {"answer": reference answer}) and whatever it stored on
        earlier steps of the same episode."""
        ...

    def shutdown(self) -> None:
        """Stop the environment's workers."""
        ...
