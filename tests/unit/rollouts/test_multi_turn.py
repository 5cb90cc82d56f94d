"""The rollout loop's bookkeeping with a scripted engine (the vLLM engine is tested in
tests/unit/generation and end to end in tests/functional)."""

import pytest
import torch

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.environments.base import EnvironmentStep
from nemo_opd.generation.interface import GenerationOutput
from nemo_opd.rollouts import run_multi_turn_rollout


class ScriptedGeneration:
    """Answers prompt i's turn t with replies[i][t] (text, tokenized), cut at the budget."""

    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies, self.calls = tokenizer, replies, []
        self.turn = {}

    def generate(self, prompts, *, max_new_tokens=None, greedy=False, seed=None, temperature=None):
        self.calls.append((prompts, max_new_tokens))
        out = GenerationOutput([], [], [])
        for prompt, budget in zip(prompts, max_new_tokens, strict=True):
            key = tuple(prompt[:6])  # the opening tokens identify the conversation
            sample = next(i for i, r in enumerate(self.replies) if r[0] == key)
            turn = self.turn.get(sample, 0)
            self.turn[sample] = turn + 1
            ids = self.tokenizer(self.replies[sample][1][turn], add_special_tokens=False)
            ids = ids["input_ids"]
            finished = len(ids) <= budget
            ids = ids[:budget]
            out.token_ids.append(ids)
            out.logprobs.append([-0.5] * len(ids))
            out.finish_reasons.append("stop" if finished else "length")
        return out


class RetryEnv:
    """Reward 1 if the answer contains the reference; otherwise ask again."""

    def __init__(self):
        self.seen = []

    def step(self, logs, metadata):
        self.seen.append([log[-1]["content"] for log in logs])
        right = [m["answer"] in log[-1]["content"] for log, m in zip(logs, metadata, strict=True)]
        return EnvironmentStep(
            rewards=[float(r) for r in right],
            done=right,
            next_messages=[None if r else {"role": "user", "content": "Try again."} for r in right],
            metadata=[dict(m, attempts=m.get("attempts", 0) + 1) for m in metadata],
        )


def _setup(tokenizer, prompts, scripts):
    formatter = ChatFormatter(tokenizer)
    logs = [formatter.prompt_log(p) for p in prompts]
    replies = [
        (tuple(sum((m["token_ids"] for m in log), [])[:6]), s)
        for log, s in zip(logs, scripts, strict=True)
    ]
    return formatter, logs, ScriptedGeneration(tokenizer, replies)


def test_two_turn_rollout_with_retry(chat_tokenizer):
    scripts = [
        ["1 + 1 = 3. \\boxed{3}<|im_end|>", "1 + 1 = 2. \\boxed{2}<|im_end|>"],
        ["2 + 2 = 4. \\boxed{4}<|im_end|>"],
    ]
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?", "What is 2 + 2?"], scripts)
    env = RetryEnv()
    result = run_multi_turn_rollout(
        engine,
        logs,
        [{"answer": "2"}, {"answer": "4"}],
        formatter,
        {"math": env},
        max_seq_len=128,
        max_rollout_turns=2,
        max_new_tokens=32,
    )
    first, second = result.message_logs
    assert [m["role"] for m in first] == ["user", "assistant", "user", "assistant"]
    assert [m["role"] for m in second] == ["user", "assistant"]
    assert first[2]["content"] == "Try again."
    assert first[3]["content"] == "1 + 1 = 2. \\boxed{2}"
    assert first[1]["generation_logprobs"] == [-0.5] * len(first[1]["token_ids"])
    assert result.rewards.tolist() == [1.0, 1.0]
    assert result.metadata[0]["attempts"] == 2 and result.metadata[1]["attempts"] == 1
    assert env.seen == [
        ["1 + 1 = 3. \\boxed{3}", "2 + 2 = 4. \\boxed{4}"],
        ["1 + 1 = 2. \\boxed{2}"],
    ]

    # The token stream is the chat template's rendering of the conversation.
    messages = [{"role": m["role"], "content": m["content"]} for m in first]
    text = chat_tokenizer.apply_chat_template(messages, tokenize=False)
    expected = chat_tokenizer(text, add_special_tokens=False)["input_ids"]
    ids = [t for m in first for t in m["token_ids"]]
    assert ids == expected[: len(ids)] and len(expected) - len(ids) == 1  # the final "\n"

    batch = flatten_message_logs(result.message_logs, chat_tokenizer.pad_token_id)
    mask = batch["token_mask"][0, : len(ids)].tolist()
    assistant = [float(m["role"] == "assistant") for m in first for _ in m["token_ids"]]
    assert mask == assistant

    metrics = result.metrics
    assert metrics["mean_turns"] == 1.5
    assert metrics["natural_termination_rate"] == 1.0
    assert metrics["truncation_rate"] == 0.0
    assert metrics["env_reward"] == 1.0
    gen = [
        sum(len(m["token_ids"]) for m in log if m["role"] == "assistant")
        for log in result.message_logs
    ]
    assert metrics["mean_generated_tokens"] == pytest.approx(sum(gen) / 2)
    assert metrics["max_generated_tokens"] == max(gen)


def test_last_turn_ends_the_episode_even_if_wrong(chat_tokenizer):
    scripts = [["\\boxed{3}<|im_end|>", "\\boxed{5}<|im_end|>"]]
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?"], scripts)
    result = run_multi_turn_rollout(
        engine, logs, [{"answer": "2"}], formatter, {"math": RetryEnv()}, 128, 2, 32
    )
    assert len(result.message_logs[0]) == 4
    assert result.rewards.tolist() == [0.0]


def test_budget_respects_max_seq_len_and_marks_truncation(chat_tokenizer):
    scripts = [["1 + 1 = 3. " * 10 + "<|im_end|>"], ["\\boxed{4}<|im_end|>"]]
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?", "What is 2 + 2?"], scripts)
    prompt_len = len(logs[0][0]["token_ids"])
    result = run_multi_turn_rollout(
        engine,
        logs,
        [{"answer": "2"}, {"answer": "4"}],
        formatter,
        {"math": RetryEnv()},
        max_seq_len=prompt_len + 20,
        max_rollout_turns=3,
        max_new_tokens=32,
    )
    assert engine.calls[0][1] == [20, 20]
    long_log = result.message_logs[0]
    assert sum(len(m["token_ids"]) for m in long_log) == prompt_len + 20
    assert result.truncated.tolist() == [True, False]
    assert result.metrics["truncation_rate"] == 0.5
    assert result.metrics["natural_termination_rate"] == 0.5
    assert len(engine.calls) == 1  # the truncated sample is not continued


def test_a_turn_cut_at_max_new_tokens_counts_as_truncated(chat_tokenizer):
    # Far below max_seq_len, but every reply is longer than max_new_tokens: each rollout was
    # cut, so each is truncated (not "neither truncated nor ended naturally").
    scripts = [["1 + 1 = 3. " * 10 + "<|im_end|>"], ["2 + 2 = 4. " * 10 + "<|im_end|>"]]
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?", "What is 2 + 2?"], scripts)
    result = run_multi_turn_rollout(
        engine,
        logs,
        [{"answer": "2"}, {"answer": "4"}],
        formatter,
        {"math": RetryEnv()},
        max_seq_len=512,
        max_rollout_turns=3,
        max_new_tokens=8,
    )
    assert [len(log[-1]["token_ids"]) for log in result.message_logs] == [8, 8]
    assert result.truncated.tolist() == [True, True]
    assert result.metrics["truncation_rate"] == 1.0
    assert result.metrics["natural_termination_rate"] == 0.0
    assert len(engine.calls) == 1  # a cut turn ends the conversation


def test_unknown_task_is_named(chat_tokenizer):
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?"], [["\\boxed{2}"]])
    with pytest.raises(KeyError, match="no environment for task 'code'"):
        run_multi_turn_rollout(
            engine,
            logs,
            [{"answer": "2", "task": "code"}],
            formatter,
            {"math": RetryEnv()},
            128,
            1,
            8,
        )
    assert torch.is_tensor(torch.zeros(1))


class LongRetryEnv(RetryEnv):
    """RetryEnv whose "try again" is `words` words long."""

    def __init__(self, words: int):
        super().__init__()
        self.message = " ".join(["Try again."] * words)

    def step(self, logs, metadata):
        step = super().step(logs, metadata)
        step.next_messages = [
            None if m is None else {"role": "user", "content": self.message}
            for m in step.next_messages
        ]
        return step


def test_a_reply_that_does_not_fit_ends_the_episode_unappended(chat_tokenizer):
    """However long an environment's reply, the conversation stays within max_seq_len: a
    reply that would leave no room for another generated token ends the episode, truncated,
    without being appended (it was appended, and the conversation outgrew the limit)."""
    scripts = [["\\boxed{3}<|im_end|>", "\\boxed{2}<|im_end|>"]] * 2
    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?", "Add 1 and 1."], scripts)
    result = run_multi_turn_rollout(
        engine, logs, [{"answer": "2"}] * 2, formatter, {"math": LongRetryEnv(40)}, 96, 3, 32
    )
    for log in result.message_logs:
        assert [m["role"] for m in log] == ["user", "assistant"]
        assert sum(len(m["token_ids"]) for m in log) <= 96
    assert result.truncated.tolist() == [True, True]
    assert result.rewards.tolist() == [0.0, 0.0]
    assert len(engine.calls) == 1

    formatter, logs, engine = _setup(chat_tokenizer, ["What is 1 + 1?"], scripts[:1])
    result = run_multi_turn_rollout(
        engine, logs, [{"answer": "2"}], formatter, {"math": LongRetryEnv(1)}, 96, 3, 32
    )
    assert [m["role"] for m in result.message_logs[0]] == ["user", "assistant"] * 2  # it fits
    assert result.truncated.tolist() == [False] and result.rewards.tolist() == [1.0]
