"""Let megatron-core 0.16 run on a machine without a GPU: the CUDA calls the Megatron engine
reaches on CPU, replaced. Used by MegatronEngine only when its device is the CPU and no GPU
is present; never at import time and never on the GPU path.

What the engine avoids instead of patching:
- GPTModel's RotaryEmbedding moves its frequencies to torch.cuda.current_device(): the engine
  computes RoPE angles itself (megatron_model.rope_angles).
- Weight initialization on the GPU and the CUDA RNG tracker: use_cpu_initialization=True and
  perform_initialization=False (weights come from the checkpoint).
- Fused kernels and sequence parallel: off.

What is patched, once, by apply_cpu_shim():
- megatron.core.tensor_parallel.random._get_cuda_rng_state / _set_cuda_rng_state. Megatron's
  activation checkpointing (recompute_granularity="full") saves and restores the CUDA RNG
  state next to the CPU one so that recomputed dropout matches; without a GPU there is none,
  so saving returns an empty tensor and restoring does nothing. The CPU RNG state is still
  saved and restored by Megatron itself.
- megatron.core.optimizer.optimizer.clip_grad_by_total_norm_fp32: Megatron's version asserts
  that every gradient is a `torch.cuda.FloatTensor` before scaling it. The replacement scales
  the same gradients by the same coefficient, max_norm / (total_norm + 1e-6) when below 1.

What is redirected while a `cuda_free()` block runs (the engine wraps every call into
Megatron's DDP and optimizer in one): Megatron allocates its gradient buffers, overflow flags
and norm accumulators with `device=torch.cuda.current_device()` or `device="cuda"`. Inside the
block torch.cuda.current_device() returns 0 and a TorchFunctionMode rewrites any CUDA
`device=` argument of a torch call to the CPU. Outside it nothing changes.
"""

import contextlib
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _ignore_cuda_rng_state(*args, **kwargs) -> None:
    return None


@torch.no_grad()
def _clip_grad_by_total_norm(
    parameters: list[torch.Tensor] | torch.Tensor,
    max_norm: float,
    total_norm: float,
    use_decoupled_grad: bool = False,
) -> None:
    """Megatron's clip_grad_by_total_norm_fp32 without its CUDA type assertion."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attribute = "decoupled_grad" if use_decoupled_grad else "grad"
    coefficient = max_norm / (total_norm + 1.0e-6)
    if coefficient >= 1.0:
        return
    for param in parameters:
        grad = getattr(param, attribute, None)
        if grad is not None:
            grad.mul_(coefficient)


def _refuse_gpu() -> None:
    if torch.cuda.is_available():
        raise RuntimeError("the megatron CPU shim must not be used where a GPU is present")


def apply_cpu_shim() -> None:
    """Patch megatron-core for a CPU-only process (idempotent; refuses when CUDA is usable)."""
    global _APPLIED
    if _APPLIED:
        return
    _refuse_gpu()
    from megatron.core.optimizer import optimizer as megatron_optimizer
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._get_cuda_rng_state = _no_cuda_rng_state
    megatron_random._set_cuda_rng_state = _ignore_cuda_rng_state
    megatron_optimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm
    _APPLIED = True


def _on_cpu(device):
    """`device` unless it names a CUDA device (a string, torch.device or ordinal): then CPU."""
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cpu")
    if isinstance(device, str | torch.device) and torch.device(device).type == "cuda":
        return torch.device("cpu")
    return device


class _CudaToCpu(TorchFunctionMode):
    """Rewrites the `device=` keyword of torch calls from a CUDA device to the CPU."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "device" in kwargs:
            kwargs = {**kwargs, "device": _on_cpu(kwargs["device"])}
        return func(*args, **kwargs)


@contextlib.contextmanager
def cuda_free() -> Iterator[None]:
    """Run megatron-core's DDP and optimizer code on the CPU (see the module docstring)."""
    _refuse_gpu()
    current_device = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0
    try:
        with _CudaToCpu():
            yield
    finally:
        torch.cuda.current_device = current_device
