"""The learning-rate schedule, the optimizer and atomic checkpoint directories."""

import pytest
import torch

from nemo_opd.config import OptimizerConfig, SchedulerConfig
from nemo_opd.policy.optim import build_optimizer, lr_factor, one_mesh
from nemo_opd.utils.checkpoint import atomic_directory


def test_schedule_warmup_then_cosine():
    cfg = SchedulerConfig(name="cosine", warmup_steps=2, decay_steps=4, min_lr_ratio=0.1)
    factors = [lr_factor(s, cfg, None) for s in range(8)]
    assert factors[:2] == pytest.approx([1 / 3, 2 / 3])
    assert factors[2] == pytest.approx(1.0)
    assert factors[6] == pytest.approx(0.1) and factors[7] == pytest.approx(0.1)


def test_atomic_directory_keeps_previous_on_failure(tmp_path):
    target = tmp_path / "ckpt"
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("one")
    with pytest.raises(RuntimeError), atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("two")
        raise RuntimeError("crash mid-save")
    assert (target / "a.txt").read_text() == "one"
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt"]
    with atomic_directory(target) as tmp:
        (tmp / "a.txt").write_text("three")
    assert (target / "a.txt").read_text() == "three"


def test_adamw_is_fused_on_one_mesh_and_steps_as_the_loop():
    # The fused kernel takes every parameter in one call; its steps are the per-tensor loop's.
    cfg = OptimizerConfig(lr=1e-2, weight_decay=0.1)
    torch.manual_seed(0)
    shapes = [(7, 5), (5,), (3, 7)]
    twins = [[torch.nn.Parameter(torch.randn(shape)) for shape in shapes] for _ in range(2)]
    for a, b in zip(*twins, strict=True):
        b.data.copy_(a.data)
    fused = build_optimizer(twins[0], cfg)
    assert fused.defaults["fused"] and one_mesh(twins[0])
    loop = torch.optim.AdamW(
        twins[1], lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=cfg.weight_decay,
        foreach=False,
    )  # fmt: skip
    for step in range(3):
        gen = torch.Generator().manual_seed(step)
        grads = [torch.randn(shape, generator=gen) for shape in shapes]
        for params, optimizer in zip(twins, (fused, loop), strict=True):
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad.clone()
            optimizer.step()
    for a, b in zip(*twins, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
