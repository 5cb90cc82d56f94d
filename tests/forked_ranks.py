"""Run a test's function in several processes, as torch.multiprocessing.spawn does, but forked
from this process's fork server (nemo_opd.distributed.process_workers), which imported torch
and the engines once: a rank starts in a fraction of a second instead of importing torch again
(several CPU-seconds each on a small machine).

A forked rank has the fork server's environment, not this process's: the variables a test's
ranks need (OMP_NUM_THREADS) are passed in `env` and set before the function's module is
imported. A variable read when a module the fork server imported was imported cannot be set
this way: TRITON_INTERPRET (triton.language is imported with torch), so the Triton kernel's
tensor-parallel test (tests/unit/losses/test_topk_kl_tp.py) spawns fresh interpreters.
"""

import importlib

import torch.multiprocessing as mp

from nemo_opd.distributed.process_workers import adopt_environ, start_fork_server


def run_ranks(function, nprocs: int, *args, env: dict[str, str] | None = None) -> None:
    """function(rank, *args) in `nprocs` forked processes, `env` set in each first; returns when
    all have ended, and raises here (torch's ProcessRaisedException, the rank's traceback in its
    message) when one raised or died."""
    start_fork_server()
    target = (function.__module__, function.__qualname__)
    mp.start_processes(
        _rank,
        args=(target, dict(env or {}), args),
        nprocs=nprocs,
        join=True,
        start_method="forkserver",
    )


def _rank(rank: int, target: tuple[str, str], env: dict[str, str], args: tuple) -> None:
    adopt_environ(env)  # as the processes executor's ranks take theirs
    module, name = target
    function = getattr(importlib.import_module(module), name)
    function(rank, *args)
