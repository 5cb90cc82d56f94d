"""One local Ray instance per test process, shared by the test modules that only need a Ray to
run actors on, instead of each module starting and stopping an instance of its own (Ray's
GCS, raylet, agents and monitors take CPU time at every start, on a machine the tests keep
busy).

    with shared_ray(cpus=2, user="test_x"):   # this process connected for the block
        ...                                    # (a module's fixture: its tests run here)
    stop_shared_ray()                          # before a module that starts Ray itself

The instance lives in a child process, the keeper (`python ray_local.py CPUS`): it starts it
as a run starts its own (nemo_opd.distributed.ray_runtime.start_local_instance) and holds it
until its stdin closes, which also happens when this process ends however it ends. A module
connects to it by its address, as a Ray job of its own, and disconnects at its end: between
modules this process is not connected to any Ray, so a module that starts its own (ray.init,
or the command line's init_ray) finds none connected, as if the shared instance did not exist.
It is started on first use, again after a stop.

- CPUs: SHARED_CPUS logical CPUs, or what a module asks for if that is more (the instance is
  then restarted that large); a module whose tests rely on the limit (exact=True) gets exactly
  what it asks for, restarting the instance if it has another size.
- Isolation: at the end of a module's block (after its own teardown, which stops its workers)
  no actor may be left alive, no placement group held and every CPU free, within SETTLE_S.
  Otherwise the instance is stopped with a SharedRayLeftovers warning that names what was left
  (pytest shows it in its summary) and the next module gets a fresh one.
- Idle: stopped IDLE_STOP_S after the last module left it (its processes poll and log even
  while nothing runs), started again on the next use.
"""

from __future__ import annotations

import atexit
import os
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

SHARED_CPUS = 4
"""Logical CPUs of the shared instance: the most a sharing module asks for (4 lets four 1-CPU
workers share a 2-core machine)."""
START_TIMEOUT_S = 180.0
"""How long the keeper may take to start Ray and print its address."""
STOP_TIMEOUT_S = 60.0
"""How long the keeper may take to stop Ray once told to; then it is killed (Ray's processes
share its fate)."""
SETTLE_S = 20.0
"""How long a module's stopped actors and placement groups may take to be released."""
IDLE_STOP_S = 120.0
"""How long the instance is kept with no module connected."""
ADDRESS_LINE = "shared ray at "
"""How the keeper's line with the instance's GCS address starts."""


class SharedRayLeftovers(UserWarning):
    """A module left actors, placement groups or held CPUs on the shared instance, which was
    stopped so that the next module gets a fresh one."""


@dataclass
class _Keeper:
    process: subprocess.Popen
    address: str
    cpus: int


_lock = threading.Lock()
_keeper: _Keeper | None = None
_idle_stop: threading.Timer | None = None
starts = 0
"""Shared instances this process has started (the suite's measurements read it)."""


@contextmanager
def shared_ray(cpus: int = 2, exact: bool = False, user: str = "a test module") -> Iterator[str]:
    """This process connected to the shared instance for the block, which has at least `cpus`
    logical CPUs (exactly `cpus` if `exact`); yields its GCS address. At the end the instance
    is checked for what `user` left on it (module docstring) and this process disconnects."""
    import ray

    if ray.is_initialized():
        raise RuntimeError(
            f"{user}: this process is already connected to Ray; disconnect (ray.shutdown()) "
            "before using the shared instance"
        )
    with _lock:
        _cancel_idle_stop()
        keeper = _keeper_of(cpus, exact)
        try:
            _connect(keeper.address)
        except Exception:  # an instance that no longer answers: once more with a fresh one
            _stop()
            keeper = _keeper_of(cpus, exact)
            _connect(keeper.address)
    try:
        yield keeper.address
    finally:
        left = _left_by_module()
        ray.shutdown()
        with _lock:
            if left:
                warnings.warn(
                    f"{user} left on the shared Ray instance: {'; '.join(left)}; it is stopped, "
                    "and the next module gets a fresh one",
                    SharedRayLeftovers,
                    stacklevel=2,
                )
                _stop()
            else:
                _schedule_idle_stop()


def stop_shared_ray() -> None:
    """Stop the shared instance if it runs (a module that starts, attaches to or stops Ray
    itself calls it first); the next use starts a fresh one."""
    with _lock:
        _cancel_idle_stop()
        _stop()


def leftovers(settle_s: float | None = None) -> list[str]:
    """What holds the connected Ray instance, waiting up to settle_s (SETTLE_S) for it to be
    released: live actors (by class), placement groups not removed, CPUs or GPUs in use.
    Empty when the instance is as fresh."""
    import ray
    from ray._private import state

    deadline = time.monotonic() + (SETTLE_S if settle_s is None else settle_s)
    while True:
        found = []
        actors = [actor for actor in state.actors().values() if actor["State"] != "DEAD"]
        if actors:
            names = ", ".join(sorted({actor["ActorClassName"] for actor in actors}))
            found.append(f"{len(actors)} live actor(s) ({names})")
        groups = ray.util.placement_group_table().values()
        held_groups = [group for group in groups if group["state"] != "REMOVED"]
        if held_groups:
            found.append(f"{len(held_groups)} placement group(s)")
        total, free = ray.cluster_resources(), ray.available_resources()
        for name in ("CPU", "GPU"):
            used = total.get(name, 0.0) - free.get(name, 0.0)
            if used > 1e-6:
                found.append(f"{used:g} of {total[name]:g} {name} in use")
        if not found or time.monotonic() >= deadline:
            return found
        time.sleep(0.25)


def _left_by_module() -> list[str]:
    """leftovers() of the connected instance, or why they could not be read."""
    import ray

    if not ray.is_initialized():
        return ["nothing readable: a test disconnected this process"]
    try:
        return leftovers()
    except Exception as error:  # the instance itself failed
        return [f"nothing readable: {type(error).__name__}: {error}"]


def _keeper_of(cpus: int, exact: bool) -> _Keeper:
    """The running keeper if it fits the request, else a fresh one that does."""
    global _keeper
    keeper = _keeper
    if keeper is not None:
        fits = keeper.cpus == cpus if exact else keeper.cpus >= cpus
        if keeper.process.poll() is not None or not fits:
            _stop()
    if _keeper is None:
        _keeper = _start(cpus if exact else max(cpus, SHARED_CPUS))
    return _keeper


def _start(cpus: int) -> _Keeper:
    """A keeper holding a new local instance of `cpus` logical CPUs, with its address."""
    global starts
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    with tempfile.TemporaryFile() as log:  # the keeper's stderr, shown if it fails to start
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(cpus)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=log,
            env=env,
            start_new_session=True,  # no terminal signal: this process decides when it stops
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while not line.startswith(ADDRESS_LINE):
            left = deadline - time.monotonic()
            ready = left > 0 and select.select([process.stdout], [], [], left)[0]
            line = process.stdout.readline().decode() if ready else ""
            if not line:  # it ended, or the time is up
                _end(process)
                log.seek(0)
                said = log.read().decode(errors="replace")[-3000:]
                raise RuntimeError(f"the shared Ray instance did not start:\n{said}")
    address = line.removeprefix(ADDRESS_LINE).strip()
    if starts == 0:
        atexit.register(stop_shared_ray)
    starts += 1
    return _Keeper(process, address, cpus)


def _connect(address: str) -> None:
    """ray.init as a driver of the instance at `address` (Ray prefers RAY_ADDRESS to its
    address argument: it is set aside meanwhile)."""
    import ray

    saved = os.environ.pop("RAY_ADDRESS", None)
    try:
        ray.init(address=address, log_to_driver=False)
    finally:
        if saved is not None:
            os.environ["RAY_ADDRESS"] = saved


def _stop() -> None:
    """End the keeper, if any (its Ray instance with it)."""
    global _keeper
    keeper, _keeper = _keeper, None
    if keeper is not None:
        _end(keeper.process)


def _end(process: subprocess.Popen) -> None:
    """Close the keeper's stdin and wait for it; kill its process group past STOP_TIMEOUT_S."""
    if process.poll() is None:
        process.stdin.close()
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(STOP_TIMEOUT_S)
    process.stdout.close()


def _schedule_idle_stop() -> None:
    global _idle_stop
    _idle_stop = threading.Timer(IDLE_STOP_S, _stop_when_idle)
    _idle_stop.daemon = True
    _idle_stop.start()


def _cancel_idle_stop() -> None:
    global _idle_stop
    if _idle_stop is not None:
        _idle_stop.cancel()
        _idle_stop = None


def _stop_when_idle() -> None:
    with _lock:
        if _idle_stop is threading.current_thread():  # not cancelled meanwhile
            _cancel_idle_stop()
            _stop()


def _keep(cpus: int) -> None:
    """The keeper: a local instance of `cpus` logical CPUs, its GCS address on stdout, held
    until stdin closes."""
    import ray

    from nemo_opd.distributed.ray_runtime import start_local_instance

    address = start_local_instance(cpus, log_to_driver=False)  # tries twice on a busy machine
    print(ADDRESS_LINE + address, flush=True)
    sys.stdin.read()
    ray.shutdown()


if __name__ == "__main__":
    _keep(int(sys.argv[1]))
