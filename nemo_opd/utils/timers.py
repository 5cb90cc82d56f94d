"""Wall-clock timing of named training phases.

    timers = Timers()
    with timers.time("train"):
        with timers.time("generation"):
            ...
    timers.summary()  # {"timing/train/generation": 1.2, "timing/train": 3.4}

Only time.perf_counter is read: no device synchronization, so a phase that launches
asynchronous GPU work is charged when the host waits for it (usually the next .item() or
collective), not when the kernels run.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager

TIMING_PREFIX = "timing/"


class Timers:
    """Accumulates seconds per phase; nested phases get slash-joined names."""

    def __init__(self) -> None:
        self._stack: list[str] = []
        self._seconds: dict[str, float] = {}

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        """Time the enclosed block as `name`, nested under any enclosing `time` blocks.

        `name` may itself contain slashes ("train/total_step_time"). Entering the same phase
        several times between summaries adds up the durations.
        """
        if not name or name.startswith("/") or name.endswith("/"):
            raise ValueError(f"timer name must be non-empty without leading/trailing '/': {name!r}")
        self._stack.append(name)
        start = time.perf_counter()
        try:
            yield
        finally:
            # Recorded even when the block raises, so a failing step still shows its cost.
            elapsed = time.perf_counter() - start
            self._stack.pop()
            self.add(name, elapsed)

    def add(self, name: str, seconds: float) -> None:
        """Record `seconds` spent on `name` elsewhere (another thread's work), nested under the
        enclosing `time` blocks like a timed block of that name."""
        full_name = "/".join([*self._stack, name])
        self._seconds[full_name] = self._seconds.get(full_name, 0.0) + seconds

    def summary(self, reset: bool = True) -> dict[str, float]:
        """Seconds per phase as {"timing/<phase>": seconds}; reset=True starts a new interval."""
        result = {TIMING_PREFIX + name: seconds for name, seconds in self._seconds.items()}
        if reset:
            self.reset()
        return result

    def reset(self) -> None:
        """Forget finished phases (phases still running keep timing and are recorded later)."""
        self._seconds.clear()
