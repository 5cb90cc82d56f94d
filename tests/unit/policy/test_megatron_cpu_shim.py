"""The Megatron CPU shim: CUDA device arguments land on the CPU inside cuda_free() and only
there, and the replacement of Megatron's gradient clipping scales like torch's."""

import pytest
import torch

pytest.importorskip("megatron.core")

from nemo_opd.policy.engines import megatron_cpu_shim  # noqa: E402

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the shim is CPU-only")


def test_cuda_free_redirects_cuda_devices_to_the_cpu():
    outside = torch.cuda.current_device
    with megatron_cpu_shim.cuda_free():
        assert torch.cuda.current_device() == 0
        tensors = [
            torch.zeros(3, device="cuda"),
            torch.tensor([1.0], device=torch.cuda.current_device()),
            torch.empty(2, device=torch.device("cuda", 0)),
            torch.ones(2, device="cpu"),
        ]
    assert all(t.device.type == "cpu" for t in tensors)
    assert torch.cuda.current_device is outside
    with pytest.raises((RuntimeError, AssertionError)):
        torch.zeros(1, device="cuda")  # outside the block nothing is redirected


def test_clip_replacement_matches_torch():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(4, 3)) for _ in range(3)]
    reference = [torch.nn.Parameter(p.detach().clone()) for p in params]
    for p, r in zip(params, reference, strict=True):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    total = torch.nn.utils.clip_grad_norm_(reference, max_norm=0.5)
    megatron_cpu_shim._clip_grad_by_total_norm(params, max_norm=0.5, total_norm=float(total))
    for p, r in zip(params, reference, strict=True):
        torch.testing.assert_close(p.grad, r.grad, rtol=1e-6, atol=0.0)
    before = [p.grad.clone() for p in params]
    megatron_cpu_shim._clip_grad_by_total_norm(params, max_norm=10.0, total_norm=0.5)
    assert all(torch.equal(p.grad, b) for p, b in zip(params, before, strict=True))


def test_apply_replaces_megatron_clipping():
    from megatron.core.optimizer import optimizer as megatron_optimizer

    megatron_cpu_shim.apply_cpu_shim()
    assert (
        megatron_optimizer.clip_grad_by_total_norm_fp32
        is megatron_cpu_shim._clip_grad_by_total_norm
    )
