"""ParallelDims layout, single-process vocab-parallel math, segment attention masks."""

import pytest
import torch
import torch.nn.functional as F

from nemo_opd.distributed.context_parallel import AttentionLayout, segment_causal_mask
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs, vocab_parallel_topk


def test_coordinates_put_tp_fastest():
    dims = ParallelDims(8, tp=2, cp=2)
    assert dims.dp == 2
    assert dims.coordinates(0) == {"dp": 0, "cp": 0, "tp": 0}
    assert dims.coordinates(3) == {"dp": 0, "cp": 1, "tp": 1}
    assert dims.coordinates(6) == {"dp": 1, "cp": 1, "tp": 0}


def test_sizes_must_divide_world():
    with pytest.raises(ValueError, match="must divide the world size"):
        ParallelDims(6, tp=4)


def test_logprobs_and_topk_match_log_softmax():
    logits = torch.randn(37, 101) * 4
    targets = torch.randint(0, 101, (37,))
    ref = torch.log_softmax(logits, -1)
    got = vocab_parallel_logprobs(logits, targets, chunk_rows=8)
    torch.testing.assert_close(got, ref.gather(-1, targets[:, None])[:, 0])
    values, indices = vocab_parallel_topk(logits, 7, chunk_rows=8)
    ref_values, ref_indices = ref.topk(7, -1)
    torch.testing.assert_close(values, ref_values)
    assert torch.equal(indices.long(), ref_indices) and indices.dtype == torch.int32


def test_segment_mask_is_causal_within_segments_with_offset():
    segments = torch.tensor([[0, 0, 0, 1, 1, 2]])
    mask = segment_causal_mask(AttentionLayout(segments, q_start=3), q_len=3, k_len=6)[0, 0]
    assert mask.tolist() == [
        [False, False, False, True, False, False],
        [False, False, False, True, True, False],
        [False, False, False, False, False, True],
    ]


def test_segment_attention_equals_separate_sequences():
    from nemo_opd.distributed.context_parallel import segment_causal_attention

    q, k, v = (torch.randn(1, 4, 7, 8) for _ in range(3))
    segments = torch.tensor([[0, 0, 0, 0, 1, 1, 1]])
    module = torch.nn.Module().eval()
    out, _ = segment_causal_attention(module, q, k[:, :2], v[:, :2], None,
                                      nemo_opd_layout=AttentionLayout(segments))  # fmt: skip
    kk, vv = k[:, :2].repeat_interleave(2, 1), v[:, :2].repeat_interleave(2, 1)
    for sl in (slice(0, 4), slice(4, 7)):
        ref = F.scaled_dot_product_attention(
            q[:, :, sl], kk[:, :, sl], vv[:, :, sl], is_causal=True
        )
        torch.testing.assert_close(out[:, sl], ref.transpose(1, 2))
