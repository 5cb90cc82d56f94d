"""Megatron's gradient buffers (DistributedDataParallel) and optimizer for the Megatron engine.

- DDP: every parameter gets a `main_grad` view into one fp32 gradient buffer; backward hooks
  accumulate each microbatch's gradients there, and `finish_grad_sync()` all-reduces the buffer
  over Megatron's data-parallel group (the engine's dp x cp ranks) as a SUM: the distillation
  loss is already normalized by the global number of valid tokens, which is what
  TransformerConfig.calculate_per_token_loss tells DDP (no division by the group size).
  No overlap of communication with backward.
- Optimizer: `get_megatron_optimizer` with Adam (Transformer Engine's or Apex's FusedAdam where
  installed, torch's AdamW otherwise; all decoupled weight decay), fp32 parameters, every
  parameter in one group with the configured weight decay (the DTensor engine's semantics), and
  Megatron's global-norm clipping (tensor-parallel shards summed, replicated parameters counted
  once) at max_grad_norm. The learning-rate schedule drives the inner torch optimizer's groups.

On a machine without a GPU every call into these objects must run inside
`megatron_cpu_shim.cuda_free()`; the engine does that (`MegatronEngine._megatron_calls`).
"""

import torch
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
from megatron.core.optimizer import OptimizerConfig as MegatronOptimizerConfig
from megatron.core.optimizer import get_megatron_optimizer
from megatron.core.optimizer.optimizer import MegatronOptimizer
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule

from nemo_opd.config import OptimizerConfig


def wrap_ddp(model: MegatronModule, config: TransformerConfig) -> DistributedDataParallel:
    """Megatron DDP around `model` (config.calculate_per_token_loss must be set: gradients
    are summed over data-parallel ranks, not averaged)."""
    if not config.calculate_per_token_loss:
        raise ValueError("the Megatron engine sums gradients: calculate_per_token_loss=True")
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=False,
    )
    return DistributedDataParallel(config, ddp_config, model)


def build_megatron_optimizer(
    ddp: DistributedDataParallel, cfg: OptimizerConfig, max_grad_norm: float | None
) -> tuple[MegatronOptimizer, torch.optim.Optimizer]:
    """(Megatron's optimizer over `ddp`'s parameters, the torch optimizer it steps).

    The second is the one learning-rate schedules, checkpoints and offloading act on.
    """
    config = MegatronOptimizerConfig(
        optimizer="adam",
        lr=cfg.lr,
        weight_decay=cfg.weight_decay,
        adam_beta1=cfg.betas[0],
        adam_beta2=cfg.betas[1],
        adam_eps=cfg.eps,
        clip_grad=max_grad_norm or 0.0,
        fp16=False,
        bf16=False,
        params_dtype=torch.float32,
        use_distributed_optimizer=False,
    )
    # config_overrides={}: no group without weight decay (Megatron's default exempts biases
    # and 1-D parameters); use_gloo_process_groups=False: the engine creates no gloo groups.
    optimizer = get_megatron_optimizer(
        config, [ddp], config_overrides={}, use_gloo_process_groups=False
    )
    inner = [chained.optimizer for chained in getattr(optimizer, "chained_optimizers", [optimizer])]
    if len(inner) != 1:
        raise RuntimeError(f"expected one Megatron optimizer for a dense model, got {len(inner)}")
    return optimizer, inner[0]
