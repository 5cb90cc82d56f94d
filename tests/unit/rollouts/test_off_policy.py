"""reference_rollout: the dataset's responses as the assistant turn, graded like rollouts."""

import pytest

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.environments.base import EnvironmentStep
from nemo_opd.rollouts.off_policy import reference_rollout

PROMPTS = ["What is 3 + 4?", "What is 12 - 5?"]
RESPONSES = ["3 + 4 = 7. \\boxed{7}", "12 - 5 = 8. \\boxed{8}"]  # the second is wrong
ANSWERS = ["7", "7"]


class ContainsAnswer:
    """Reward 1 when the last message contains the reference answer."""

    def step(self, logs, metadata):
        right = [m["answer"] in log[-1]["content"] for log, m in zip(logs, metadata, strict=True)]
        return EnvironmentStep(
            rewards=[float(r) for r in right],
            done=[True] * len(logs),
            next_messages=[None] * len(logs),
            metadata=[dict(m, graded=True) for m in metadata],
        )


def rollout(tokenizer, max_seq_len=128):
    formatter = ChatFormatter(tokenizer)
    logs = formatter.prompt_logs(PROMPTS)
    metadata = [
        {"prompt": p, "answer": a, "response": r}
        for p, a, r in zip(PROMPTS, ANSWERS, RESPONSES, strict=True)
    ]
    result = reference_rollout(logs, metadata, formatter, {"math": ContainsAnswer()}, max_seq_len)
    return logs, result


def test_each_prompt_is_followed_by_its_response_up_to_eos(chat_tokenizer):
    prompts, result = rollout(chat_tokenizer)
    eos = chat_tokenizer.eos_token_id
    for prompt, log, response in zip(prompts, result.message_logs, RESPONSES, strict=True):
        assert log[:-1] == prompt  # the prompt log is kept as it was
        reply = log[-1]
        assert reply["role"] == "assistant" and reply["content"] == response
        expected = chat_tokenizer(response, add_special_tokens=False)["input_ids"] + [eos]
        assert reply["token_ids"] == expected
    batch = flatten_message_logs(result.message_logs, chat_tokenizer.pad_token_id)
    for row, log in enumerate(result.message_logs):
        start = sum(len(m["token_ids"]) for m in log[:-1])
        mask = batch["token_mask"][row, : batch["input_lengths"][row]]
        assert mask[:start].sum() == 0 and mask[start:].all()  # only the response is trained


def test_responses_are_graded_by_the_environment(chat_tokenizer):
    _, result = rollout(chat_tokenizer)
    assert result.rewards.tolist() == [1.0, 0.0]
    assert all(meta["graded"] for meta in result.metadata)
    assert result.metrics["env_reward"] == 0.5 and result.metrics["mean_turns"] == 1.0
    assert result.metrics["natural_termination_rate"] == 1.0
    assert not result.truncated.any()


def test_a_response_longer_than_the_sequence_is_cut_and_marked(chat_tokenizer):
    prompts, result = rollout(chat_tokenizer, max_seq_len=20)
    for prompt, log in zip(prompts, result.message_logs, strict=True):
        assert sum(len(m["token_ids"]) for m in log) == 20
        assert log[:-1] == prompt
    assert result.truncated.tolist() == [True, True]
    assert result.metrics["truncation_rate"] == 1.0


def test_a_cut_response_is_graded_on_what_is_left(chat_tokenizer):
    """The reward is the reward of what is trained: a right answer cut off before it is
    stated is wrong, and the message's text is the cut tokens' text."""
    formatter = ChatFormatter(chat_tokenizer)
    prompt_tokens = sum(len(m["token_ids"]) for m in formatter.prompt_logs(PROMPTS[:1])[0])
    full = chat_tokenizer(RESPONSES[0], add_special_tokens=False)["input_ids"]
    n = max(n for n in range(len(full)) if "7" not in chat_tokenizer.decode(full[:n]))
    kept = full[:n]  # up to "3 + 4 =", before the answer
    _, result = rollout(chat_tokenizer, max_seq_len=prompt_tokens + len(kept))
    reply = result.message_logs[0][-1]
    assert reply["token_ids"] == kept
    assert reply["content"] == chat_tokenizer.decode(kept, skip_special_tokens=True)
    assert "7" not in reply["content"]
    assert result.rewards.tolist() == [0.0, 0.0]  # the full first response is right
    assert result.truncated.tolist()[0]


def test_a_sample_without_a_response_is_refused(chat_tokenizer):
    formatter = ChatFormatter(chat_tokenizer)
    with pytest.raises(ValueError, match="have no response"):
        reference_rollout(formatter.prompt_logs(PROMPTS[:1]), [{"answer": "7"}], formatter, {}, 64)
