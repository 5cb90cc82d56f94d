from nemo_opd.algorithms.prompts import encode_prompts, repeat_samples
from nemo_opd.data.chat import ChatFormatter


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
