import pytest

from nemo_opd.algorithms.prompts import check_fills_one_batch, encode_prompts, repeat_samples
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.errors import SetupError


def test_long_prompts_are_skipped_and_counted(chat_tokenizer):
    formatter = ChatFormatter(chat_tokenizer)
    records = [
        {"prompt": "What is 1 + 1?", "answer": "2"},
        {"prompt": "What is 1 + 1? " * 20, "answer": "2"},
        {"prompt": "What is 3 + 4?", "answer": "7"},
    ]
    prompts = encode_prompts(records, formatter, max_tokens=40, where="train")
    assert prompts.skipped == 1
    assert [s["metadata"]["answer"] for s in prompts.samples] == ["2", "7"]
    logs, metadata = repeat_samples(prompts.samples, 2)
    assert [m["answer"] for m in metadata] == ["2", "2", "7", "7"]
    assert logs[0] is logs[1]
    metadata[0]["attempts"] = 1
    assert "attempts" not in metadata[1]


def test_too_few_usable_prompts_for_one_batch(chat_tokenizer):
    formatter = ChatFormatter(chat_tokenizer)
    records = [{"prompt": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    prompts = encode_prompts(records, formatter, max_tokens=40, where="train")
    check_fills_one_batch(prompts, 5, 40)
    with pytest.raises(SetupError) as raised:
        check_fills_one_batch(prompts, 6, 40)
    assert str(raised.value) == (
        "distillation.num_prompts_per_step is 6 but there are only 5 usable train prompts: lower "
        "distillation.num_prompts_per_step to at most 5 or add prompts"
    )
    records.append({"prompt": "What is 1 + 1? " * 20, "answer": "2"})
    prompts = encode_prompts(records, formatter, max_tokens=40, where="train")
    with pytest.raises(SetupError) as raised:
        check_fills_one_batch(prompts, 6, 40)
    assert str(raised.value) == (
        "distillation.num_prompts_per_step is 6 but there are only 5 usable train prompts (1 "
        "skipped as longer than 40 tokens): lower distillation.num_prompts_per_step to at most 5, "
        "add prompts, or raise data.max_input_seq_length"
    )
