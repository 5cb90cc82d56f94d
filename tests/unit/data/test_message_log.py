import torch

from nemo_opd.data.message_log import flatten_message_logs, log_length


def test_flatten_marks_assistant_tokens_and_pads():
    logs = [
        [{"role": "user", "token_ids": [1, 2]}, {"role": "assistant", "token_ids": [3, 4, 5]}],
        [
            {"role": "user", "token_ids": [1]},
            {"role": "assistant", "token_ids": [6]},
            {"role": "user", "token_ids": [7, 8]},
            {"role": "assistant", "token_ids": [9]},
        ],
    ]
    batch = flatten_message_logs(logs, pad_token_id=0, pad_to_multiple=4)
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 0, 0, 0], [1, 6, 7, 8, 9, 0, 0, 0]]
    assert batch["input_lengths"].tolist() == [5, 5]
    assert batch["token_mask"].tolist() == [[0, 0, 1, 1, 1, 0, 0, 0], [0, 1, 0, 0, 1, 0, 0, 0]]
    assert torch.equal(batch["sample_mask"], torch.ones(2))
    assert log_length(logs[1]) == 5


def test_generation_logprobs_sit_at_their_tokens():
    from nemo_opd.data.message_log import flatten_generation_logprobs

    logs = [
        [
            {"role": "user", "token_ids": [1, 2]},
            {"role": "assistant", "token_ids": [3, 4], "generation_logprobs": [-0.1, -0.2]},
        ]
    ]
    values, mask = flatten_generation_logprobs(logs, 5)
    assert torch.allclose(values, torch.tensor([[0.0, 0.0, -0.1, -0.2, 0.0]]))
    assert mask.tolist() == [[0, 0, 1, 1, 0]]
