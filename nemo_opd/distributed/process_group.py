"""torch.distributed in a worker: a group of ranks joined over TCP (one process per rank, under
Ray), or the one-rank group of a run in one process (the local executor)."""

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist

DEFAULT_TIMEOUT_S = 300.0


def node_address() -> str:
    """An address of this node that the other workers can reach (called in a Ray actor)."""
    try:
        import ray.util

        return ray.util.get_node_ip_address()
    except Exception:  # outside Ray (tests run single-process)
        return "127.0.0.1"


def find_free_port() -> int:
    """A TCP port that is free on this node right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def backend_for(device_type: str) -> str:
    """nccl on CUDA, gloo on CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


def init_distributed(
    rank: int,
    world_size: int,
    master_addr: str,
    master_port: int,
    device_type: str,
    timeout_s: float = DEFAULT_TIMEOUT_S,
) -> None:
    """Join the process group; every collective (init included) times out after timeout_s.

    A missing peer therefore raises an error after timeout_s instead of hanging forever.
    """
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(
        backend=backend_for(device_type),
        init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )


def init_local_process_group(device_type: str) -> None:
    """The process's one-rank group, created on the first call (an in-memory store: no port,
    no peer) and shared by every later caller: the student's and the teacher's engines of a run
    in one process, and vLLM's engine there, which joins the group it finds (or creates one
    that this call then finds). Raises RuntimeError when this process is already in a group of
    several ranks or of another backend."""
    if dist.is_initialized():
        backend = backend_for(device_type)
        if dist.get_world_size() != 1 or dist.get_backend() != backend:
            raise RuntimeError(
                f"this process is already in a torch.distributed group of "
                f"{dist.get_world_size()} ranks ({dist.get_backend()}); a run in one process "
                f"needs a one-rank {backend} group"
            )
        return
    if device_type == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
    dist.init_process_group(
        backend=backend_for(device_type),
        store=dist.HashStore(),
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=DEFAULT_TIMEOUT_S),
    )
