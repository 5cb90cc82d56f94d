"""Global gradient norm and clipping over parameters that may be DTensors on several meshes."""

from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The local shard of a DTensor (an alias), or the tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def total_grad_norm(parameters: Iterable[torch.nn.Parameter]) -> torch.Tensor:
    """The L2 norm of all gradients as if they were full tensors, fp32 scalar.

    Squares of local shards are summed per (mesh, sharded axes); each sum is all-reduced over
    exactly the mesh axes along which the gradient is sharded, so replicated copies count once.
    Every rank must call this with its parameters in the same order.
    """
    buckets: dict[tuple, list] = {}
    for param in parameters:
        grad = param.grad
        if grad is None:
            continue
        if isinstance(grad, DTensor):
            mesh = grad.device_mesh
            axes = tuple(i for i, p in enumerate(grad.placements) if not p.is_replicate())
        else:
            mesh, axes = None, ()
        square = _local(grad).detach().float().pow(2).sum()
        key = (id(mesh), axes)
        if key in buckets:
            buckets[key][1] += square
        else:
            buckets[key] = [mesh, square]
    total = torch.zeros((), dtype=torch.float32)
    for (_, axes), (mesh, square) in buckets.items():
        for axis in axes:
            dist.all_reduce(square, group=mesh.get_group(axis))
        total = total.to(square.device) + square
    return total.sqrt()


def clip_grad_norm(parameters: list[torch.nn.Parameter], max_norm: float | None) -> torch.Tensor:
    """Scale gradients so their global norm is at most max_norm (None: only measure).

    Returns:
        the global norm before clipping (fp32 scalar).
    """
    norm = total_grad_norm(parameters)
    if max_norm is not None:
        scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
        for param in parameters:
            if param.grad is not None:
                _local(param.grad).mul_(scale.to(param.grad.dtype))
    return norm


def all_reduce_grads(parameters: Iterable[torch.nn.Parameter], group: dist.ProcessGroup) -> None:
    """Sum the (local shards of the) gradients of `parameters` over `group`, in place."""
    for param in parameters:
        if param.grad is not None:
            dist.all_reduce(_local(param.grad), group=group)
