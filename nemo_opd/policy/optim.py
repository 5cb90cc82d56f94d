"""build_optimizer / build_scheduler from PolicyConfig.optimizer and .scheduler."""

import math

import torch
from torch.distributed.tensor import DTensor

from nemo_opd.config import OptimizerConfig, SchedulerConfig


def build_optimizer(
    params: list[torch.nn.Parameter], cfg: OptimizerConfig
) -> torch.optim.Optimizer:
    """AdamW with decoupled weight decay: torch's fused kernel (one pass over each parameter's
    weight, gradient and moments; faster than the per-tensor loop, docs/benchmarks.md) where
    every parameter lives on one device mesh (plain tensors, or DTensors of a single mesh: one
    process, FSDP alone); the per-tensor loop otherwise (tensor parallelism puts parameters on
    several meshes, which a multi-tensor kernel cannot take in one call)."""
    fused = one_mesh(params)
    return torch.optim.AdamW(
        params,
        lr=cfg.lr,
        betas=cfg.betas,
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
        foreach=None if fused else False,
    )


def one_mesh(params: list[torch.nn.Parameter]) -> bool:
    """Whether the parameters are all plain tensors, or all DTensors of one device mesh."""
    meshes = {p.device_mesh if isinstance(p, DTensor) else None for p in params}
    return len(meshes) <= 1


def lr_factor(step: int, cfg: SchedulerConfig | None, total_steps: int | None) -> float:
    """Multiplier of the peak lr after `step` optimizer steps: linear warmup from 0, then
    constant, cosine or linear decay to min_lr_ratio over decay_steps (default: the steps
    left until total_steps)."""
    if cfg is None:
        return 1.0
    if step < cfg.warmup_steps:
        return (step + 1) / (cfg.warmup_steps + 1)
    if cfg.name == "constant":
        return 1.0
    decay = cfg.decay_steps or (total_steps - cfg.warmup_steps if total_steps else None)
    if not decay:
        raise ValueError(
            f"scheduler {cfg.name!r} needs scheduler.decay_steps or the run's total steps"
        )
    progress = min(1.0, (step - cfg.warmup_steps) / decay)
    cosine = 0.5 * (1.0 + math.cos(math.pi * progress))
    shape = cosine if cfg.name == "cosine" else 1.0 - progress
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * shape


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: SchedulerConfig | None, total_steps: int | None = None
) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR following lr_factor (checked once here, so a bad config fails at build)."""
    lr_factor(max(cfg.warmup_steps, 1) if cfg else 0, cfg, total_steps)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, cfg, total_steps)
    )


def build_training_optimizer(
    params: list[torch.nn.Parameter],
    optimizer: OptimizerConfig | None,
    scheduler: SchedulerConfig | None,
    total_steps: int | None,
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """An engine's optimizer and schedule; a trainable policy must have an optimizer section."""
    if optimizer is None:
        raise ValueError("a trainable policy needs an optimizer section")
    built = build_optimizer(params, optimizer)
    return built, build_scheduler(built, scheduler, total_steps)
