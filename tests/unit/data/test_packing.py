"""Sequence packing: bin assignment, packed layout, and the round trip back to rows."""

import pytest
import torch

from nemo_opd.data.packing import ALGORITHMS, pack_row, plan_packing, unpack_row


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_every_sequence_is_packed_once_within_capacity(algorithm):
    lengths = [7, 30, 3, 16, 16, 1, 25, 9, 12]
    bins = plan_packing(lengths, capacity=32, round_to=4, algorithm=algorithm)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    for b in bins:
        assert sum(-(-lengths[i] // 4) * 4 for i in b) <= 32


def test_first_fit_decreasing_fills_rows():
    lengths = [6, 5, 4, 3, 2, 2, 2]  # 24 tokens: FFD fits them in 3 rows of 8
    bins = plan_packing(lengths, capacity=8, algorithm="first_fit_decreasing")
    assert len(bins) == 3
    assert bins[0] == [0, 4]


def test_too_long_sequence_is_rejected():
    with pytest.raises(ValueError, match="does not fit"):
        plan_packing([5, 40], capacity=32)


def test_pack_row_layout_and_round_trip():
    ids = torch.arange(1, 25).reshape(3, 8)
    extra = torch.randn(3, 8, 2)
    lengths = [5, 8, 2]
    row = pack_row(
        {"input_ids": ids, "extra": extra}, lengths, [1, 0, 2], capacity=24, round_to=2, pad_to=4
    )
    # slots 8, 6, 2 -> 16 tokens, already a multiple of 4
    assert row.tensors["input_ids"].shape == (1, 16)
    assert row.cu_seqlens.tolist() == [0, 8, 14, 16]
    assert row.position_ids[0].tolist() == [*range(8), *range(6), 0, 1]
    assert row.segment_ids[0].tolist() == [0] * 8 + [1] * 6 + [2] * 2
    assert row.tensors["input_ids"][0, 8:14].tolist() == [1, 2, 3, 4, 5, 0]
    out = torch.zeros(3, 8, 2)
    unpack_row(row.tensors["extra"], row, out)
    for seq, length in enumerate(lengths):
        torch.testing.assert_close(out[seq, :length], extra[seq, :length])
        assert out[seq, length:].abs().sum() == 0


def test_tail_padding_gets_its_own_segment():
    ids = torch.ones(2, 4, dtype=torch.long)
    row = pack_row({"input_ids": ids}, [3, 2], [0, 1], capacity=8, pad_to=4)
    assert row.tensors["input_ids"].shape == (1, 8)
    assert row.segment_ids[0].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
