"""Multi-turn rollouts: generate, let the environment grade and reply, repeat.

Each turn, every still-active conversation is continued by the generation engine with a budget
that keeps it within max_seq_len; the environment then grades the new assistant message, says
whether the episode is done, and may reply: a new user message (for example "try again") or
tool results (`tool` messages, nemo_opd.environments.tool_env), tokenized with the chat
template and appended. A conversation stops when the
environment is done, when max_rollout_turns assistant turns were made, when a turn ended without
a natural stop (cut at max_new_tokens, or at max_seq_len), or when the environment's reply
would leave no room for another generated token within max_seq_len (the reply is then not
appended, so a conversation never grows past max_seq_len, however long the reply); the last
two mark it truncated, so every rollout either ended naturally or was truncated.

Seeds: with a seed, the request of conversation i (its index in the call) at turn t samples
with request_seed(seed, i, t) (nemo_opd.utils.seeds), whatever other conversations are still
active, so a turn draws other random numbers than any earlier turn of any conversation.
"""

from collections import defaultdict
from dataclasses import dataclass, field

import torch

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import Message, log_length
from nemo_opd.environments.base import Environment
from nemo_opd.generation.interface import GenerationInterface
from nemo_opd.utils.seeds import request_seed

DEFAULT_TASK = "math"


@dataclass
class RolloutResult:
    """The finished conversations.

    message_logs[i]: the conversation of sample i; assistant messages carry "token_ids" and
        "generation_logprobs" (one per token).
    rewards: [B] float32, the environment's reward for each sample's last assistant turn.
    truncated: [B] bool, the conversation was cut (at max_new_tokens or at max_seq_len).
    metadata[i]: the environment's metadata after the last step.
    metrics: rollout statistics (see rollout_metrics).
    env_metrics: the environments' step metrics summed over turns, as env/<task>/<name>.
    """

    message_logs: list[list[Message]]
    rewards: torch.Tensor
    truncated: torch.Tensor
    metadata: list[dict]
    metrics: dict[str, float] = field(default_factory=dict)
    env_metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class RolloutState:
    """Per-sample bookkeeping while the rollout runs."""

    turns: int = 0
    generated: int = 0
    active: bool = True
    truncated: bool = False
    natural_stop: bool = False
    reward: float = 0.0


def run_multi_turn_rollout(
    generation: GenerationInterface,
    message_logs: list[list[Message]],
    metadata: list[dict],
    formatter: ChatFormatter,
    task_to_env: dict[str, Environment],
    max_seq_len: int,
    max_rollout_turns: int,
    max_new_tokens: int,
    *,
    greedy: bool = False,
    seed: int | None = None,
    temperature: float | None = None,
) -> RolloutResult:
    """Run every conversation to its end (see the module docstring).

    Args:
        generation: the engine holding the student's current weights.
        message_logs: B tokenized prompt logs (ChatFormatter.prompt_log), ending with the
            assistant header.
        metadata: B dicts for the environment; "task" picks the environment (default "math").
        formatter: tokenizes environment replies.
        task_to_env: environments by task name.
        max_seq_len: most tokens in a conversation.
        max_rollout_turns: most assistant turns per conversation.
        max_new_tokens: most tokens per assistant turn.
        greedy: decode greedily (validation).
        seed: sampling seed of this call (see request_seed); None uses the engine's RNG.
        temperature: sampling temperature (None: the engine's configured one).
    """
    logs = [list(log) for log in message_logs]
    metadata = [dict(m) for m in metadata]
    states = [RolloutState() for _ in logs]
    env_metrics: dict[str, float] = defaultdict(float)
    for turn in range(max_rollout_turns):
        active = [i for i, s in enumerate(states) if s.active]
        active = _stop_full(active, logs, states, max_seq_len)
        if not active:
            break
        seeds = None if seed is None else [request_seed(seed, i, turn) for i in active]
        budget = (max_new_tokens, max_seq_len)
        sampling = {"greedy": greedy, "seed": seeds, "temperature": temperature}
        _generate_turn(generation, formatter, logs, states, active, budget, sampling)
        steps, step_metrics = grade(task_to_env, logs, metadata, active)
        for name, value in step_metrics.items():
            env_metrics[name] += value
        last_turn = turn == max_rollout_turns - 1
        for i, (reward, done, reply, meta) in steps.items():
            state = states[i]
            state.reward, metadata[i] = reward, meta
            if done or last_turn or reply is None or not state.natural_stop:
                state.active = False
                continue
            extended = formatter.extend(logs[i], reply if isinstance(reply, list) else [reply])
            if log_length(extended) >= max_seq_len:  # no room left for the next turn
                state.active, state.truncated = False, True
                continue
            logs[i] = extended
    return finished_rollout(logs, states, metadata, dict(env_metrics))


def finished_rollout(
    logs: list[list[Message]],
    states: list[RolloutState],
    metadata: list[dict],
    env_metrics: dict[str, float],
) -> RolloutResult:
    """The RolloutResult of finished conversations and their bookkeeping."""
    return RolloutResult(
        message_logs=logs,
        rewards=torch.tensor([s.reward for s in states], dtype=torch.float32),
        truncated=torch.tensor([s.truncated for s in states]),
        metadata=metadata,
        metrics=rollout_metrics(states),
        env_metrics=env_metrics,
    )


def concat_rollouts(parts: list[RolloutResult]) -> RolloutResult:
    """The rollouts of several batches as one, in order: metrics that are means over samples
    weighted by each part's samples (max_generated_tokens their max), env metrics (counts)
    summed."""
    samples = [part.metrics.get("samples", float(len(part.message_logs))) for part in parts]
    total = max(1.0, sum(samples))
    metrics: dict[str, float] = {}
    for name in parts[0].metrics:
        values = [part.metrics[name] for part in parts]
        if name == "samples":
            metrics[name] = sum(values)
        elif name.startswith("max_"):
            metrics[name] = max(values)
        else:
            metrics[name] = sum(v * n for v, n in zip(values, samples, strict=True)) / total
    env_metrics: dict[str, float] = defaultdict(float)
    for part in parts:
        for name, value in part.env_metrics.items():
            env_metrics[name] += value
    return RolloutResult(
        message_logs=[log for part in parts for log in part.message_logs],
        rewards=torch.cat([part.rewards for part in parts]),
        truncated=torch.cat([part.truncated for part in parts]),
        metadata=[meta for part in parts for meta in part.metadata],
        metrics=metrics,
        env_metrics=dict(env_metrics),
    )


def rollout_state(rollout: RolloutResult) -> dict:
    """A rollout as tensors, lists, dicts and numbers (torch.load(weights_only=True) reads
    it back): for checkpoints."""
    return {
        "message_logs": rollout.message_logs,
        "rewards": rollout.rewards,
        "truncated": rollout.truncated,
        "metadata": rollout.metadata,
        "metrics": rollout.metrics,
        "env_metrics": rollout.env_metrics,
    }


def rollout_from_state(saved: dict) -> RolloutResult:
    """The rollout rollout_state() gave."""
    return RolloutResult(**saved)


def _stop_full(active: list[int], logs: list, states: list[RolloutState], max_seq_len: int) -> list:
    """Deactivate (and mark truncated) conversations with no room for another token."""
    keep = []
    for i in active:
        if log_length(logs[i]) >= max_seq_len:
            states[i].active, states[i].truncated = False, True
        else:
            keep.append(i)
    return keep


def _generate_turn(
    generation: GenerationInterface,
    formatter: ChatFormatter,
    logs: list,
    states: list[RolloutState],
    active: list[int],
    budget: tuple[int, int],
    sampling: dict,
) -> None:
    """One assistant message for each active conversation, appended to its log; budget is
    (max_new_tokens, max_seq_len), sampling the generate() keywords greedy, seed (one per
    active conversation, or None) and temperature."""
    max_new_tokens, max_seq_len = budget
    prompts = [[t for m in logs[i] for t in m["token_ids"]] for i in active]
    budgets = [min(max_new_tokens, max_seq_len - len(p)) for p in prompts]
    output = generation.generate(prompts, max_new_tokens=budgets, **sampling)
    for j, i in enumerate(active):
        ids, logprobs = output.token_ids[j], output.logprobs[j]
        state = states[i]
        state.turns += 1
        state.generated += len(ids)
        state.natural_stop = output.finish_reasons[j] == "stop"
        state.truncated = not state.natural_stop  # cut at max_new_tokens or at max_seq_len
        logs[i].append(
            {
                "role": "assistant",
                "content": formatter.tokenizer.decode(ids, skip_special_tokens=True),
                "token_ids": list(ids),
                "generation_logprobs": list(logprobs),
            }
        )


def grade(
    task_to_env: dict, logs: list, metadata: list, active: list[int]
) -> tuple[dict, dict[str, float]]:
    """({sample: (reward, done, reply, metadata)}, {"env/<task>/<name>": value}) from each
    sample's environment, one batched call per task."""
    by_task = defaultdict(list)
    for i in active:
        by_task[metadata[i].get("task", DEFAULT_TASK)].append(i)
    results, metrics = {}, {}
    for task, rows in by_task.items():
        if task not in task_to_env:
            raise KeyError(f"no environment for task {task!r}; have {sorted(task_to_env)}")
        step = task_to_env[task].step([logs[i] for i in rows], [metadata[i] for i in rows])
        for j, i in enumerate(rows):
            results[i] = (step.rewards[j], step.done[j], step.next_messages[j], step.metadata[j])
        metrics.update({f"env/{task}/{name}": value for name, value in step.metrics.items()})
    return results, metrics


def rollout_metrics(states: list[RolloutState]) -> dict[str, float]:
    """The number of samples, and means over them: generated tokens (and the max), turns,
    natural termination (the last turn ended on a stop), truncation, and reward."""
    count = max(1, len(states))
    return {
        "samples": float(len(states)),
        "mean_generated_tokens": sum(s.generated for s in states) / count,
        "max_generated_tokens": float(max((s.generated for s in states), default=0)),
        "mean_turns": sum(s.turns for s in states) / count,
        "natural_termination_rate": sum(s.natural_stop for s in states) / count,
        "truncation_rate": sum(s.truncated for s in states) / count,
        "env_reward": sum(s.reward for s in states) / count,
    }
