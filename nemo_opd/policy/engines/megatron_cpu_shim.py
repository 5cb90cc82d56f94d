"""Let megatron-core 0.16 run on a machine without a GPU: the only CUDA calls the Megatron
engine reaches on CPU, replaced. Applied by MegatronEngine when its device is the CPU and no
GPU is present; never at import time and never on the GPU path.

What the engine avoids instead of patching (so the shim stays this small):
- GPTModel's RotaryEmbedding moves its frequencies to torch.cuda.current_device(): the engine
  computes RoPE angles itself (megatron_model.rope_angles).
- Weight initialization on the GPU and the CUDA RNG tracker: use_cpu_initialization=True and
  perform_initialization=False (weights come from the checkpoint).
- Fused kernels, sequence parallel, Megatron's DDP buffers and optimizer (found_inf,
  clip_grads and the grad buffers allocate on torch.cuda.current_device()): off or not used.

What is patched (megatron.core.tensor_parallel.random):
- _get_cuda_rng_state / _set_cuda_rng_state. Megatron's activation checkpointing
  (tensor_parallel.checkpoint, used by recompute_granularity="full") saves and restores the
  CUDA RNG state next to the CPU one so that recomputed dropout matches; without a GPU there
  is no CUDA RNG state, so saving returns an empty tensor and restoring does nothing. The CPU
  RNG state is still saved and restored by Megatron itself.
"""

import torch

_APPLIED = False


def _no_cuda_rng_state(*args, **kwargs) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8)


def _ignore_cuda_rng_state(*args, **kwargs) -> None:
    return None


def apply_cpu_shim() -> None:
    """Patch megatron-core for a CPU-only process (idempotent; refuses when CUDA is usable)."""
    global _APPLIED
    if _APPLIED:
        return
    if torch.cuda.is_available():
        raise RuntimeError("the megatron CPU shim must not be applied where a GPU is present")
    from megatron.core.tensor_parallel import random as megatron_random

    megatron_random._get_cuda_rng_state = _no_cuda_rng_state
    megatron_random._set_cuda_rng_state = _ignore_cuda_rng_state
    _APPLIED = True
