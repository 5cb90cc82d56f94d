"""Off-policy "rollouts": the dataset's reference responses as the assistant turn.

What an off-policy step of the loop trains on (distillation.lmbda < 1, as TRL's GKD with a
dataset's completions; objective.loss sft): each prompt followed by its record's response,
rendered with the chat template and cut after the EOS token as a generated turn would end.
The result has the same shape as run_multi_turn_rollout's, so the rest of a step (flatten,
teacher scoring, training, logging) is the same code: the environment grades the responses
like rollouts (so the reward says how good the data is), and a response that does not fit in
max_seq_len is cut there (its text too: what is graded is what is trained) and marked
truncated. Responses carry no generation log-probs.
"""

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import Message, log_length
from nemo_opd.environments.base import Environment
from nemo_opd.rollouts.multi_turn import RolloutResult, RolloutState, finished_rollout, grade


def reference_rollout(
    message_logs: list[list[Message]],
    metadata: list[dict],
    formatter: ChatFormatter,
    task_to_env: dict[str, Environment],
    max_seq_len: int,
) -> RolloutResult:
    """Each prompt log (ChatFormatter.prompt_log) followed by metadata[i]["response"].

    Args:
        message_logs: B tokenized prompt logs, ending with the assistant header.
        metadata: B dicts holding "response" (data.response_key) and what the environment
            reads ("answer", "task").
        formatter: renders and tokenizes the responses.
        task_to_env: environments by task name, to grade the responses.
        max_seq_len: most tokens in a conversation; longer responses are cut.
    """
    missing = [i for i, meta in enumerate(metadata) if "response" not in meta]
    if missing:
        raise ValueError(f"samples {missing[:5]} have no response (data.response_key)")
    logs = formatter.response_logs(message_logs, [meta["response"] for meta in metadata])
    states = [_cut_to_fit(log, max_seq_len, formatter) for log in logs]
    metadata = [dict(meta) for meta in metadata]
    graded, env_metrics = grade(task_to_env, logs, metadata, list(range(len(logs))))
    for i, (reward, _done, _reply, meta) in graded.items():
        states[i].reward, metadata[i] = reward, meta
    return finished_rollout(logs, states, metadata, env_metrics)


def _cut_to_fit(log: list[Message], max_seq_len: int, formatter: ChatFormatter) -> RolloutState:
    """Cut the log's last (assistant) message so the log holds at most max_seq_len tokens, in
    place, its text with it (the environment grades what is trained, as a rollout cut by its
    budget); the turn's bookkeeping as a rollout would keep it."""
    reply = log[-1]
    excess = max(0, log_length(log) - max_seq_len)
    if excess:
        reply["token_ids"] = reply["token_ids"][: len(reply["token_ids"]) - excess]
        reply["content"] = formatter.tokenizer.decode(reply["token_ids"], skip_special_tokens=True)
    tokens = len(reply["token_ids"])
    return RolloutState(
        turns=1, generated=tokens, active=False, truncated=bool(excess), natural_stop=not excess
    )
