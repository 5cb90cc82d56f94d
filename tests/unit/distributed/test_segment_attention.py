"""segment_causal_attention without context parallelism (plain causal and per-segment paths)
against a float64 brute force over an explicit (causal, same segment) mask; the packed rows'
one-call path (torch's varlen flash attention) with the kernel's documented semantics on the
CPU (tests/varlen_reference.py), and with the kernel itself on CUDA."""

import pytest
import torch
from varlen_reference import reference_varlen

from nemo_opd.distributed.context_parallel import (
    LAYOUT_KWARG,
    AttentionLayout,
    causal_varlen,
    segment_causal_attention,
    segment_runs,
    varlen_available,
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


def inputs(segments, heads=4, kv_heads=2, d=8, dtype=torch.float32, device="cpu"):
    """Random query [b, heads, s, d], key and value [b, kv_heads, s, d] for `segments`."""
    gen = torch.Generator().manual_seed(0)
    b, s = len(segments), len(segments[0])
    shapes = [(b, heads, s, d), (b, kv_heads, s, d), (b, kv_heads, s, d)]
    return [
        torch.randn(shape, generator=gen).to(device, dtype).requires_grad_() for shape in shapes
    ]


def assert_matches_brute_force(attend, qkv, segment_ids, atol=1e-6, rtol=1e-5):
    """attend(query, key, value) -> [b, s, h, d] equals the float64 brute force, and so do
    its gradients for a random weighting of the output."""
    scale = qkv[0].shape[-1] ** -0.5
    out = attend(*qkv, scale)
    expected = brute_force(*qkv, segment_ids.to(qkv[0].device), scale).transpose(1, 2)
    torch.testing.assert_close(out.double(), expected, atol=atol, rtol=rtol)

    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    weights = weights.to(out.device)
    grads = torch.autograd.grad((out * weights.to(out.dtype)).sum(), qkv)
    ref_inputs = [t.detach().double().requires_grad_() for t in qkv]
    ref = brute_force(*ref_inputs, segment_ids.to(qkv[0].device), scale).transpose(1, 2)
    ref_grads = torch.autograd.grad((ref * weights.double()).sum(), ref_inputs)
    for got, want in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(got.double(), want, atol=atol, rtol=rtol)


@pytest.mark.parametrize("packed_attention", ["per_segment", "auto"])
@pytest.mark.parametrize("precomputed", [False, True])
@pytest.mark.parametrize("name", sorted(SEGMENTS))
def test_matches_masked_brute_force(name, precomputed, packed_attention):
    """On the CPU, auto is the per-segment path."""
    segment_ids = torch.tensor(SEGMENTS[name])
    runs = segment_runs(segment_ids) if precomputed else None
    layout = AttentionLayout(segment_ids, runs=runs, packed_attention=packed_attention)

    def attend(query, key, value, scale):
        module, kwargs = _Module(), {LAYOUT_KWARG: layout}
        return segment_causal_attention(module, query, key, value, None, scale, **kwargs)[0]

    assert_matches_brute_force(attend, inputs(SEGMENTS[name]), segment_ids)


@pytest.mark.parametrize("kv_heads", [2, 4])
@pytest.mark.parametrize("name", sorted(SEGMENTS))
def test_varlen_path_hands_the_kernel_every_run_as_a_sequence(name, kv_heads):
    """causal_varlen with the kernel's documented semantics (float64, on the CPU): the rows laid
    end to end, a sequence per run, the answer in transformers' [b, s, h, d]."""
    segment_ids = torch.tensor(SEGMENTS[name])
    runs = segment_runs(segment_ids)

    def attend(query, key, value, scale):
        return causal_varlen(query, key, value, runs, scale, attend=reference_varlen)

    assert_matches_brute_force(attend, inputs(SEGMENTS[name], kv_heads=kv_heads), segment_ids)


@pytest.mark.parametrize("takes_enable_gqa", [True, False])
def test_varlen_path_calls_torchs_function_as_its_release_takes_it(takes_enable_gqa, monkeypatch):
    """torch's own varlen_attn (here its semantics, on the CPU) is called with grouped key and
    value heads where it takes enable_gqa, and with them repeated per query head where it does
    not (torch 2.10 and 2.11)."""
    import torch.nn.attention.varlen as torch_varlen

    import nemo_opd.distributed.context_parallel as context_parallel

    seen = []

    def release(query, key, value, cu_q, cu_k, max_q, max_k, *, scale=None, window_size=(-1, -1)):
        seen.append(key.shape[1])
        return reference_varlen(
            query, key, value, cu_q, cu_k, max_q, max_k, scale=scale, window_size=window_size
        )

    def newer(*args, enable_gqa=False, **kwargs):
        seen.append(args[1].shape[1])
        return reference_varlen(*args, enable_gqa=enable_gqa, **kwargs)

    monkeypatch.setattr(torch_varlen, "varlen_attn", newer if takes_enable_gqa else release)
    parameters = {"scale", "window_size"} | ({"enable_gqa"} if takes_enable_gqa else set())
    monkeypatch.setattr(context_parallel, "_varlen_parameters", lambda: frozenset(parameters))
    segment_ids = torch.tensor(SEGMENTS["packed rows"])
    runs = segment_runs(segment_ids)

    def attend(query, key, value, scale):
        return causal_varlen(query, key, value, runs, scale)

    assert_matches_brute_force(attend, inputs(SEGMENTS["packed rows"], kv_heads=2), segment_ids)
    assert seen == [2 if takes_enable_gqa else 4]


def test_varlen_asked_where_it_cannot_run_says_what_to_set():
    segment_ids = torch.tensor(SEGMENTS["packed rows"])
    layout = AttentionLayout(segment_ids, packed_attention="varlen")
    query, key, value = inputs(SEGMENTS["packed rows"])
    with pytest.raises(RuntimeError, match="needs CUDA.*packed_attention to auto or per_segment"):
        segment_causal_attention(_Module(), query, key, value, None, **{LAYOUT_KWARG: layout})


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", sorted(SEGMENTS))
def test_gpu_varlen_kernel_matches_brute_force(name, dtype):
    """torch's varlen flash attention itself, through segment_causal_attention's auto path on
    CUDA, against the float64 brute force (half-precision tolerances)."""
    assert varlen_available(torch.device("cuda"))
    segment_ids = torch.tensor(SEGMENTS[name])
    layout = AttentionLayout(segment_ids.cuda(), packed_attention="auto")

    def attend(query, key, value, scale):
        module, kwargs = _Module(), {LAYOUT_KWARG: layout}
        return segment_causal_attention(module, query, key, value, None, scale, **kwargs)[0]

    qkv = inputs(SEGMENTS[name], d=64, dtype=dtype, device="cuda")
    assert_matches_brute_force(attend, qkv, segment_ids, atol=2e-2, rtol=2e-2)


def test_segment_runs_are_contiguous_runs_of_equal_ids():
    ids = torch.tensor([[0, 0, 1, 1, 1, 2], [5, 5, 5, 5, 5, 5]])
    assert segment_runs(ids) == [[(0, 2), (2, 5), (5, 6)], [(0, 6)]]
