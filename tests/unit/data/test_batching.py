"""TensorBatch and the microbatch / data-parallel splits."""

import torch

from nemo_opd.data.batching import (
    TensorBatch,
    dynamic_microbatches,
    fixed_microbatches,
    pad_batch_to_multiple,
    shard_for_data_parallel,
)


def _batch(rows: int) -> TensorBatch:
    return TensorBatch(
        {
            "input_ids": torch.arange(rows * 3).reshape(rows, 3),
            "sample_mask": torch.ones(rows),
            "token_mask": torch.ones(rows, 3),
        }
    )


def test_dp_shards_take_a_piece_of_every_global_batch():
    shards = shard_for_data_parallel(_batch(8), dp_size=2, rows_per_step=4)
    assert shards[0]["input_ids"][:, 0].tolist() == [0, 3, 12, 15]
    assert shards[1]["input_ids"][:, 0].tolist() == [6, 9, 18, 21]


def test_padding_rows_do_not_count():
    padded, size = pad_batch_to_multiple(_batch(5), 4)
    assert size == 5 and padded.size == 8
    assert padded["sample_mask"].tolist() == [1] * 5 + [0] * 3
    assert padded["token_mask"][5:].sum() == 0


def test_concat_pads_the_sequence_dim():
    a = TensorBatch({"x": torch.ones(1, 2)})
    b = TensorBatch({"x": torch.ones(2, 4)})
    assert TensorBatch.concat([a, b])["x"].tolist()[0] == [1, 1, 0, 0]


def test_microbatch_splits_cover_every_row():
    assert fixed_microbatches(5, 2) == [[0, 1], [2, 3], [4]]
    groups = dynamic_microbatches([10, 30, 8, 31, 12], token_budget=64, round_to=8)
    assert sorted(i for g in groups for i in g) == list(range(5))
    for g in groups:
        longest = max([10, 30, 8, 31, 12][i] for i in g)
        assert len(g) == 1 or -(-longest // 8) * 8 * len(g) <= 64
