"""A trainer's own module, made ready for one generation call and put back afterwards.

    with serving(module):          # eval mode, sdpa attention, FSDP's parameters gathered
        decode(module, rows, ...)  # every forward reads the parameters as the trainer holds them

What a call changes, and restores on the way out:
- training mode: eval for the call (dropout off; transformers' gradient checkpointing, which
  also turns the KV cache off, applies in training mode only);
- attention: sdpa, which honours the padding mask and the KV cache (a training engine's own
  attention may read another layout: the project's segment attention ignores both);
- FSDP2 (the DTensor engine wraps a module in bf16, or on more than one rank): its parameters
  are gathered once for the whole call (every group unsharded in the compute precision) and
  kept gathered between forwards, where FSDP by default gathers and frees every layer at every
  forward, which at one forward per generated token would cast the float32 master weights to
  bf16 once per token. On exit they are resharded, and each group frees or keeps its
  parameters after a forward as fully_shard left it (the root keeps them, every other group
  frees them: the layout the DTensor engine's apply_fsdp builds). At world size 1 the gathered
  parameters are plain tensors; they hold the model once in the compute precision for the
  call's length, freed after it.
"""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.distributed.fsdp import FSDPModule

GENERATION_ATTENTION = "sdpa"
"""The attention a shared module generates with: a training attention may ignore the padding
mask or the KV cache (the project's segment attention reads its own layout)."""


@contextmanager
def serving(module: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """`module` ready to generate for the block (see the module docstring); its training mode,
    attention implementation and FSDP state are put back afterwards, also on an error."""
    training, attention = module.training, module.config._attn_implementation
    groups = [m for m in module.modules() if isinstance(m, FSDPModule)]
    module.eval()
    if attention != GENERATION_ATTENTION:
        module.set_attn_implementation(GENERATION_ATTENTION)
    try:
        with _gathered(module, groups):
            yield module
    finally:
        if attention != GENERATION_ATTENTION:
            module.set_attn_implementation(attention)
        module.train(training)


@contextmanager
def _gathered(root: torch.nn.Module, groups: list[FSDPModule]) -> Iterator[None]:
    """Every FSDP group's parameters gathered for the block, and kept so between forwards;
    afterwards fully_shard's defaults again (the root keeps its parameters after a forward)."""
    if not groups:
        yield
        return
    for group in groups:
        group.set_reshard_after_forward(False, recurse=False)
        group.unshard()
    try:
        yield
    finally:
        for group in groups:
            group.reshard()
            group.set_reshard_after_forward(group is not root, recurse=False)
