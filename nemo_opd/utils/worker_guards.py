"""Guards for worker processes that handle untrusted input (grader and tool workers).

Each worker calls them at start, before it reads a request: it dies with its parent, its
address space and the files it may write are capped (hard limits, which the process cannot
raise again), and its replies go out on a private stream so that stray prints cannot corrupt
them.
"""

import ctypes
import os
import resource
import signal
import sys

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> None:
    """Ask the kernel to kill this process when its parent dies (Linux); exit at once if the
    parent is already gone. For the kernel the parent is the thread that started this process,
    not its process: the pools start their workers from a thread that lives as long as they do
    (nemo_opd.utils.worker_processes)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        sys.exit(0)


def limit_memory(megabytes: int) -> None:
    """Cap the address space (RLIMIT_AS) at megabytes: an allocation past it fails with
    MemoryError instead of swapping the machine."""
    _lower_limit(resource.RLIMIT_AS, megabytes * 2**20)


def limit_file_size(megabytes: int) -> None:
    """Cap the size of any file this process writes (RLIMIT_FSIZE; its stderr file
    included): a write past it fails with an OSError (SIGXFSZ is ignored) instead of filling
    the disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    _lower_limit(resource.RLIMIT_FSIZE, megabytes * 2**20)


def _lower_limit(which: int, limit: int) -> None:
    """Set both the soft and the hard limit (a soft limit alone, the process could raise up to
    the hard one)."""
    _, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(which, (limit, limit))


def protocol_stream():
    """A private binary stream on the original stdout; fd 1 then points at stderr, so stray
    prints of the libraries land there."""
    stream = os.fdopen(os.dup(1), "wb", buffering=0)
    os.dup2(2, 1)
    return stream
