"""torch.nn.attention.varlen.varlen_attn's documented semantics in float64, for the CPU, where
the flash kernel does not run: the tests check what nemo_opd hands it and makes of its answer
(tests/unit/distributed/test_segment_attention.py also runs the real kernel on CUDA)."""

import torch


def reference_varlen(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seq_q: torch.Tensor,
    cu_seq_k: torch.Tensor,
    max_q: int,
    max_k: int,
    *,
    scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    enable_gqa: bool = False,
) -> torch.Tensor:
    """query [T, h_q, d], key/value [T, h_kv, d]; sequence i is tokens cu_seq[i]:cu_seq[i + 1]
    of each; window_size (-1, 0) is causal, (-1, -1) full. Returns [T, h_q, d] in the query's
    dtype, differentiable."""
    assert torch.equal(cu_seq_q, cu_seq_k), "self-attention: the same sequences"
    assert cu_seq_q.dtype == torch.int32 and window_size in ((-1, 0), (-1, -1))
    heads, kv_heads, dim = query.shape[1], key.shape[1], query.shape[2]
    assert enable_gqa == (kv_heads != heads), "enable_gqa exactly when the heads differ"
    scale = dim**-0.5 if scale is None else scale
    bounds = cu_seq_q.tolist()
    assert bounds[0] == 0 and bounds[-1] == query.shape[0]
    pieces = []
    for start, end in zip(bounds, bounds[1:], strict=False):
        assert 0 < end - start <= min(max_q, max_k)
        q, k, v = (t[start:end].transpose(0, 1).double() for t in (query, key, value))
        k = k.repeat_interleave(heads // kv_heads, 0)
        v = v.repeat_interleave(heads // kv_heads, 0)
        scores = (q @ k.transpose(-1, -2)) * scale
        if window_size == (-1, 0):
            visible = torch.ones(end - start, end - start, dtype=torch.bool).tril()
            scores = scores.masked_fill(~visible, float("-inf"))
        pieces.append((scores.softmax(-1) @ v).transpose(0, 1))
    return torch.cat(pieces).to(query.dtype)
