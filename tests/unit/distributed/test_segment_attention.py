"""segment_causal_attention without context parallelism (plain causal and per-segment paths)
against a float64 brute force over an explicit (causal, same segment) mask."""

import pytest
import torch

from nemo_opd.distributed.context_parallel import (
    LAYOUT_KWARG,
    AttentionLayout,
    segment_causal_attention,
    segment_runs,
)


class _Module(torch.nn.Module):
    pass


def brute_force(query, key, value, segment_ids, scale):
    """[b, h_q, s, d] float64 reference; key/value heads repeated for grouped queries."""
    q, k, v = (t.double() for t in (query, key, value))
    repeats = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(repeats, 1), v.repeat_interleave(repeats, 1)
    s = q.shape[2]
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    same = segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)  # [b, s, s]
    visible = (causal & same).unsqueeze(1)
    scores = (q @ k.transpose(-1, -2)) * scale
    scores = scores.masked_fill(~visible, float("-inf"))
    return scores.softmax(-1) @ v


SEGMENTS = {
    "one segment per row": [[0] * 11, [0] * 11],
    "packed rows": [[0, 0, 0, 1, 1, 2, 2, 2, 2, 3, 3], [0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2]],
    "a row of length-1 segments": [list(range(11)), [0] * 11],
}


@pytest.mark.parametrize("precomputed", [False, True])
@pytest.mark.parametrize("name", sorted(SEGMENTS))
def test_matches_masked_brute_force(name, precomputed):
    gen = torch.Generator().manual_seed(0)
    segment_ids = torch.tensor(SEGMENTS[name])
    b, s, d = segment_ids.shape[0], segment_ids.shape[1], 8
    query = torch.randn(b, 4, s, d, generator=gen, requires_grad=True)
    key = torch.randn(b, 2, s, d, generator=gen, requires_grad=True)
    value = torch.randn(b, 2, s, d, generator=gen, requires_grad=True)
    scale = d**-0.5
    layout = AttentionLayout(segment_ids, runs=segment_runs(segment_ids) if precomputed else None)

    out, _ = segment_causal_attention(
        _Module(), query, key, value, None, scaling=scale, **{LAYOUT_KWARG: layout}
    )
    expected = brute_force(query, key, value, segment_ids, scale).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, atol=1e-6, rtol=1e-5)

    weights = torch.randn(out.shape, generator=gen)
    grads = torch.autograd.grad((out * weights).sum(), (query, key, value))
    ref_inputs = [t.detach().double().requires_grad_() for t in (query, key, value)]
    ref = brute_force(*ref_inputs, segment_ids, scale).transpose(1, 2)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), ref_inputs)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, atol=1e-6, rtol=1e-5)


def test_segment_runs_are_contiguous_runs_of_equal_ids():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert segment_runs(ids) == [[(0, 2), (2, 5), (5, 6)], [(0, 6)]]
