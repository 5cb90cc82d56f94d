"""The fused Triton top-k KL against the float64 brute force and the torch implementation.

Without a GPU the kernels run in Triton's interpreter, which must be switched on before triton
is first imported. A plain `pytest` run has usually imported triton already (other tests import
transformers), so then these tests run in a fresh interpreter instead: the test
`test_kernels_in_a_fresh_interpreter` re-runs this file with TRITON_INTERPRET=1 and reports its
result. Running this file directly with TRITON_INTERPRET=1 exported runs everything in-process.
"""

import math
import os
import subprocess
import sys

import pytest
import torch
from topk_kl_testing import (
    KL_SWEEP,
    TAIL_SWEEP,
    TOLERANCES,
    assert_matches_reference,
    check_empty_slots,
    check_jsd_endpoints_are_the_kls,
    check_teacher_ruling_out_ids,
    check_zero_weight_rows_add_nothing,
    make_case,
    run_impl,
    run_reference,
)

from nemo_opd.losses import DistillationLossFn, TopkKLParams, topk_kl, topk_kl_weighted_sum
from nemo_opd.losses.topk_kl_torch import topk_kl_torch_forward
from nemo_opd.ops import topk_kl_triton as ops

CUDA = torch.cuda.is_available()
DEVICE = "cuda" if CUDA else "cpu"
IN_PROCESS = CUDA or ops.kernels_interpreted()
needs_kernel = pytest.mark.skipif(
    not IN_PROCESS, reason="triton was imported without TRITON_INTERPRET; see the subprocess test"
)
IMPL = "triton"


@pytest.mark.skipif(IN_PROCESS, reason="the kernels run in this process")
def test_kernels_in_a_fresh_interpreter():
    # In the child the kernels are interpreted, so this test is skipped there (no recursion).
    assert os.environ.get("_NEMO_OPD_KERNEL_TESTS_CHILD") != "1", "TRITON_INTERPRET had no effect"
    env = dict(os.environ, TRITON_INTERPRET="1", _NEMO_OPD_KERNEL_TESTS_CHILD="1")
    # -n 0: the child runs its tests itself, without starting xdist's worker processes
    cmd = [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", __file__]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout.splitlines()[-1], result.stdout[-2000:]


@pytest.mark.skipif(
    os.environ.get("_NEMO_OPD_KERNEL_TESTS_CHILD") == "1", reason="run by the parent process"
)
def test_cpu_without_interpreter_is_a_clear_error():
    code = (
        "import torch\n"
        "from nemo_opd.losses import topk_kl\n"
        "z = torch.randn(2, 8); a, i = torch.log_softmax(torch.randn(2, 8), -1).topk(3)\n"
        "try:\n"
        "    topk_kl(z, a, i, implementation='triton')\n"
        "except RuntimeError as e:\n"
        "    print('ERROR', e)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert "ERROR" in result.stdout, result.stderr[-3000:]
    assert "TRITON_INTERPRET=1" in result.stdout and 'implementation="torch"' in result.stdout


def _case(n, vocab, k, dtype=torch.float32, **kwargs):
    return [t.to(DEVICE) for t in make_case(n, vocab, k, dtype=dtype, **kwargs)]


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_matches_brute_force(kl_type, tail, temperature, dtype):
    logits, logprobs, ids = _case(6, 401, 9, dtype=dtype, seed=1)
    grad_out = torch.linspace(-1.5, 2.0, 6, device=DEVICE)
    assert_matches_reference(
        IMPL, logits, logprobs, ids, grad_out, kl_type=kl_type, tail=tail, temperature=temperature
    )


@needs_kernel
@pytest.mark.parametrize(
    ("n", "vocab", "k"), [(3, 1271, 1), (2, 1, 1), (5, 37, 36), (1, 2, 2), (4, 64, 64)]
)
def test_odd_shapes(n, vocab, k):
    logits, logprobs, ids = _case(n, vocab, k, seed=3, teacher_scale=1.0)
    for kl_type in KL_SWEEP:
        for tail in TAIL_SWEEP:
            assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail)


@needs_kernel
def test_float16_logits():
    logits, logprobs, ids = _case(4, 301, 7, dtype=torch.float16, seed=4)
    for kl_type in KL_SWEEP:
        assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, temperature=0.7)


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_extreme_logits(kl_type, tail):
    logits, logprobs, ids = _case(5, 401, 9, seed=5)
    gen = torch.Generator().manual_seed(0)
    logits = logits + 1e4 * torch.randint(-1, 2, logits.shape, generator=gen).to(DEVICE)
    logits[:, ids[0, 0]] = 1e4
    assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail)
    assert_matches_reference(IMPL, logits.bfloat16(), logprobs, ids, kl_type=kl_type, tail=tail)


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_parameter_endpoints(tail):
    logits, logprobs, ids = _case(4, 301, 7, seed=6)
    check_jsd_endpoints_are_the_kls(IMPL, tail, DEVICE)
    for weight, pure in ((1.0, "forward"), (0.0, "reverse")):
        mixed = run_impl(IMPL, logits, logprobs, ids, kl_type="mixed", mixed_kl_weight=weight)
        single = run_impl(IMPL, logits, logprobs, ids, kl_type=pure)
        torch.testing.assert_close(mixed[0], single[0], atol=0, rtol=0)
        torch.testing.assert_close(mixed[2], single[2], atol=1e-7, rtol=1e-6)


@needs_kernel
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_student_tail_below_the_floor(kl_type):
    """Q_tail underflows (ids outside S at -1e4) while the teacher keeps a large tail: the
    tail's log is floored at log(eps) and, as with a clamp, passes no gradient."""
    logits, logprobs, ids = _case(4, 301, 7, seed=19, scale=1.0)
    logits = torch.full_like(logits, -1e4).scatter(1, ids, logits.gather(1, ids))
    assert_matches_reference(IMPL, logits, logprobs, ids, kl_type=kl_type, temperature=0.7)


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_teacher_ruling_out_ids(kl_type, tail):
    check_teacher_ruling_out_ids(IMPL, kl_type, tail, DEVICE)


@needs_kernel
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_tail_bucket_precise_when_the_top_k_holds_nearly_all_mass(kl_type):
    logits, logprobs, ids = _case(4, 401, 8, seed=9, scale=1.0)
    logits = logits.scatter_add(1, ids, torch.full(ids.shape, 28.0, device=DEVICE))
    logprobs = (
        logprobs
        - torch.logsumexp(logprobs, dim=-1, keepdim=True)
        + torch.log(torch.tensor(0.95, device=DEVICE))
    )
    exact, _ = run_reference(logits.cpu(), logprobs.cpu(), ids.cpu(), kl_type=kl_type)
    assert (1 - exact["student_topk_mass"] < 1e-9).all()
    reference = run_impl("torch", logits, logprobs, ids, kl_type=kl_type)
    div, _, grad = run_impl(IMPL, logits, logprobs, ids, kl_type=kl_type)
    torch.testing.assert_close(div, reference[0], rtol=1e-5, atol=1e-6)
    outside = torch.ones_like(grad, dtype=torch.bool).scatter(1, ids, False)
    torch.testing.assert_close(grad[outside], reference[2][outside], rtol=1e-3, atol=1e-30)


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("block_v", [16, 64, 128])
def test_many_vocab_blocks_match_torch(block_v, tail):
    """Small blocks: the online max rescaling and the cursor over S cross many blocks (some
    with no S id, some with several)."""
    logits, logprobs, ids = _case(5, 1271, 23, dtype=torch.bfloat16, seed=12, scale=4.0)
    logits[1, 700:] += 30.0  # the row max arrives late: earlier blocks get rescaled
    ids[2] = torch.arange(100, 123)  # all of S inside one or two blocks
    for kl_type in ("reverse", "jsd"):
        params = TopkKLParams(kl_type=kl_type, tail=tail, temperature=0.9)
        expect = topk_kl_torch_forward(logits, logprobs, ids, params)
        got = ops.topk_kl_triton_forward(logits, logprobs, ids, params, block_v=block_v)
        *_, grad_rtol = TOLERANCES[torch.bfloat16]
        torch.testing.assert_close(got[0], expect[0], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got[1], expect[1], atol=2e-5, rtol=1e-4)
        torch.testing.assert_close(got[2].float(), expect[2].float(), atol=2e-5, rtol=grad_rtol)


@needs_kernel
@pytest.mark.parametrize("block_v", [16, 64])
@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_logits_at_minus_inf(tail, block_v, monkeypatch):
    """A masked or padded vocabulary: the first vocab blocks of row 0 hold only -inf, row 1 is
    -inf outside one window, row 2 at every third id. The online max must not form
    exp(-inf - -inf); the result is the brute force's, with a zero gradient at -inf."""
    monkeypatch.setattr(ops, "_vocab_block", lambda vocab, block, bucket=False: (block_v, 4))
    logits, logprobs, ids = _case(5, 301, 7, seed=23)
    ids[0] = torch.tensor([170, 199, 230, 250, 260, 281, 300])
    logits[0, :160] = -math.inf
    ids[1] = torch.arange(130, 137)
    logits[1, :120], logits[1, 180:] = -math.inf, -math.inf
    every_third = torch.zeros(301, dtype=torch.bool, device=DEVICE)
    every_third[::3] = True
    every_third[ids[2]] = False
    logits[2, every_third] = -math.inf
    for kl_type in KL_SWEEP:
        div, _, grad = assert_matches_reference(
            IMPL, logits, logprobs, ids, kl_type=kl_type, tail=tail, temperature=0.9
        )
        assert torch.isfinite(div).all() and torch.isfinite(grad).all()
        assert grad[logits == -math.inf].eq(0).all()


@needs_kernel
def test_inplace_grad_and_no_grad():
    logits, logprobs, ids = _case(4, 301, 6, seed=15)
    weights = torch.arange(4.0, device=DEVICE)
    expected = run_impl(IMPL, logits, logprobs, ids, weights, kl_type="mixed")
    leaf = logits.clone().requires_grad_()
    z = leaf * 1.0
    mixed = TopkKLParams(kl_type="mixed")
    div = topk_kl(z, logprobs, ids, params=mixed, implementation=IMPL, inplace_grad=True)
    torch.testing.assert_close(div, expected[0])
    (div * weights).sum().backward()
    torch.testing.assert_close(leaf.grad, expected[2])
    with torch.no_grad():
        div, _, grad = ops.topk_kl_triton_forward(
            logits, logprobs, ids, TopkKLParams(kl_type="mixed"), need_grad=False
        )
    assert grad is None
    torch.testing.assert_close(div, expected[0])


@needs_kernel
def test_id_order_and_dtype_do_not_matter():
    logits, logprobs, ids = _case(4, 301, 6, seed=16)
    first = run_impl(IMPL, logits, logprobs, ids)
    flipped = run_impl(IMPL, logits, logprobs.flip(-1), ids.flip(-1).int())
    for x, y in zip(first, flipped, strict=True):
        torch.testing.assert_close(x, y)


@needs_kernel
def test_distillation_loss_with_the_kernel_equals_torch():
    logits, logprobs, ids = _case(6, 211, 5, seed=17)
    data = {
        "teacher_topk_logprobs": logprobs.view(2, 3, 5),
        "teacher_topk_indices": ids.view(2, 3, 5),
        "token_mask": torch.tensor([[1, 1, 1], [0, 1, 0]], device=DEVICE),
        "sample_mask": torch.ones(2, device=DEVICE),
    }
    results = []
    for implementation in ("triton", "torch"):
        z = logits.view(2, 3, 211).clone().requires_grad_()
        loss_fn = DistillationLossFn(
            params=TopkKLParams(kl_type="jsd"), implementation=implementation
        )
        loss, metrics = loss_fn(z, data, global_valid_toks=5)
        loss.backward()
        results.append((loss, metrics, z.grad))
    torch.testing.assert_close(results[0][0], results[1][0])
    torch.testing.assert_close(results[0][1], results[1][1])
    torch.testing.assert_close(results[0][2], results[1][2])


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_gpu_realistic_shape_matches_torch(tail):
    """Compiled kernel at a real vocabulary size, and its memory: no fp32 [N, V] buffer."""
    logits, logprobs, ids = _case(64, 151936, 128, dtype=torch.bfloat16, seed=20)
    for kl_type in KL_SWEEP:
        params = TopkKLParams(kl_type=kl_type, tail=tail, temperature=0.8)
        expect = topk_kl_torch_forward(logits, logprobs, ids, params)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        got = ops.topk_kl_triton_forward(logits, logprobs, ids, params)
        torch.cuda.synchronize()
        extra = torch.cuda.max_memory_allocated() - base
        assert extra < logits.numel() * logits.element_size() * 1.1  # the gradient, and O(N k)
        torch.testing.assert_close(got[0], expect[0], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[1], expect[1], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(got[2].float(), expect[2].float(), atol=1e-6, rtol=1e-2)


@needs_kernel
def test_weighted_sum_folds_the_weights_into_the_gradient():
    logits, logprobs, ids = _case(6, 201, 5, seed=21)
    weights = torch.tensor([0.5, 0.0, 2.0, 1.0, 0.0, 0.25], device=DEVICE)
    jsd = TopkKLParams(kl_type="jsd")
    div, _, grad = run_impl(IMPL, logits, logprobs, ids, weights, kl_type="jsd")
    for scale in (1.0, 3.0):  # 1.0: the Triton backward skips its pass over the gradient
        z = logits.clone().requires_grad_()
        total, stats = topk_kl_weighted_sum(z, logprobs, ids, weights, params=jsd,
                                            implementation=IMPL)  # fmt: skip
        (scale * total).backward()
        torch.testing.assert_close(total, (div * weights).sum())
        torch.testing.assert_close(z.grad, scale * grad)
        assert stats.forward_kl.shape == (6,)
    with torch.no_grad():
        total, _ = topk_kl_weighted_sum(logits, logprobs, ids, weights, params=jsd,
                                        implementation=IMPL)  # fmt: skip
    torch.testing.assert_close(total, (div * weights).sum())


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
def test_weighted_sum_rows_of_weight_zero_add_nothing(tail):
    check_zero_weight_rows_add_nothing(IMPL, tail, DEVICE)


@needs_kernel
@pytest.mark.parametrize("tail", TAIL_SWEEP)
@pytest.mark.parametrize("kl_type", KL_SWEEP)
def test_empty_slots(kl_type, tail):
    check_empty_slots(IMPL, kl_type, tail, DEVICE)
