"""Starting the worker processes of the grader and tool pools: from a thread that lives as long
as the pool, with an environment of their own.

Why a thread of its own: each worker asks the kernel to kill it when its parent dies
(worker_guards.die_with_parent, Linux's PR_SET_PDEATHSIG), and for the kernel the parent is the
thread that started the process, not the process: a worker started from a thread that then
ends (a pool's call from the rollout producer's thread, which ends after the last step) would
be killed with it, mid-run. WorkerStarter starts every process of its pool from one daemon
thread that ends only when the pool is closed, after its workers.

Why an environment of their own: a worker reads model output, so it gets only what it needs
to run (worker_environment), never the driver's secrets (API keys, tokens, credentials).
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import IO

import nemo_opd

START_TIMEOUT_S = 30.0
"""How long a caller waits for its process to be started (the fork and exec, not the worker's
own start-up, which its pool times)."""

_STOP_TIMEOUT_S = 5.0

BASE_VARIABLES = (
    "PATH",
    "HOME",
    "TMPDIR",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "LD_LIBRARY_PATH",
    "PYTHONHOME",
    "PYTHONHASHSEED",
)
"""What a worker gets from the driver's environment whatever it is told (where set): enough to
start the same Python, find programs, a home and a temporary directory, and read text as the
driver does."""


def worker_environment(extra: Iterable[str] = ()) -> dict[str, str]:
    """The environment of a worker process: BASE_VARIABLES and the `extra` names that are set
    in this process's environment, and PYTHONPATH with the package's root first (so that the
    worker imports this nemo_opd, however the driver found it), then the driver's own."""
    env = {name: os.environ[name] for name in (*BASE_VARIABLES, *extra) if name in os.environ}
    root = str(Path(nemo_opd.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))
    return env


class WorkerStarter:
    """Starts processes (subprocess.Popen) from one long-lived daemon thread (module
    docstring); close() ends the thread, once its processes are stopped."""

    def __init__(self, name: str):
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(
            target=_serve, args=(self._requests,), name=name, daemon=True
        )
        self._thread.start()

    def popen(self, command: list[str], **kwargs) -> subprocess.Popen:
        """subprocess.Popen(command, **kwargs), run in the starter's thread; its errors are
        raised here."""
        if not self._thread.is_alive():
            raise RuntimeError("the worker starter was closed")
        started: Future = Future()
        self._requests.put((command, kwargs, started))
        return started.result(timeout=START_TIMEOUT_S)

    def close(self) -> None:
        """End the thread (safe to call twice)."""
        if self._thread.is_alive():
            self._requests.put(None)
            self._thread.join(timeout=_STOP_TIMEOUT_S)


def _serve(requests: queue.SimpleQueue) -> None:
    """The starter's thread: start what is asked until told to stop (None)."""
    while (request := requests.get()) is not None:
        command, kwargs, started = request
        try:
            started.set_result(subprocess.Popen(command, **kwargs))
        except Exception as error:  # the caller's to handle, in its own thread
            started.set_exception(error)


def stop_process(
    process: subprocess.Popen, stderr: IO | None, kill: bool = False, timeout_s: float = 5.0
) -> None:
    """End a worker process of a pool: kill it, or close its stdin and give it `timeout_s` to
    exit, killing it after that; then reap it and close its pipes and `stderr` (its log)."""
    if not kill:
        try:
            process.stdin.close()
            process.wait(timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if process.poll() is None:
        process.kill()
        process.wait(timeout=timeout_s)
    for stream in (process.stdin, process.stdout, stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()
