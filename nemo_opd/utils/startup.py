"""Where a run's start-up time goes: timestamps per process, reported as one table.

Every process of a run (the driver, each training worker, each vLLM engine) notes wall-clock
times (time.time(), comparable across the processes of one machine) as it starts:

    marks = StartupMarks()            # "process": when the OS started this process
    ...imports, building...
    marks.note("engine_ready")
    marks.as_dict()                   # {"process": t0, "init": t1, "engine_ready": t2}

The driver collects them and prints them relative to its own process start
(format_startup_report), and logs them as timing/startup/* metrics, so a slow start-up can be
pinned on imports, Ray, a worker's engine build or vLLM's, without a profiler.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

from nemo_opd.utils.text_width import packed

STARTUP_PREFIX = "timing/startup/"


def process_start_time() -> float | None:
    """time.time() at which the OS started this process (Linux /proc, to 10 ms), or None
    elsewhere."""
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            # Field 22 (starttime, clock ticks since boot) follows the ")" of the command name.
            fields = stat.read().rsplit(")", 1)[1].split()
        with open("/proc/uptime", encoding="ascii") as uptime:
            since_boot = float(uptime.read().split()[0])
        now = time.time()
        return now - (since_boot - int(fields[19]) / os.sysconf("SC_CLK_TCK"))
    except (OSError, ValueError, IndexError):
        return None


class StartupMarks:
    """Named wall-clock times of one process's start-up, in the order they were noted; the
    first, "process", is when the OS started the process (or when this object was made, where
    that is unknown), the second, "init", when this object was made."""

    def __init__(self) -> None:
        now = time.time()
        started = process_start_time()
        self._marks: dict[str, float] = {"process": now if started is None else started}
        self._marks["init"] = now

    def note(self, name: str) -> None:
        """Record that `name` happened now."""
        self._marks[name] = time.time()

    def as_dict(self) -> dict[str, float]:
        return dict(self._marks)


def startup_metrics(origin: float, processes: Mapping[str, Mapping[str, float]]) -> dict:
    """timing/startup/<process>/<mark>: seconds from `origin` (the driver's process start) to
    each mark of each process."""
    return {
        f"{STARTUP_PREFIX}{process}/{mark}": round(when - origin, 3)
        for process, marks in processes.items()
        for mark, when in marks.items()
    }


def format_startup_report(
    origin: float, processes: Mapping[str, Mapping[str, float]], columns: int | None = None
) -> str:
    """A row per process, wrapped at `columns` (the console's width): each mark as "name
    seconds since the driver started", then the seconds between consecutive marks in brackets,
    e.g.

        start-up (s after the command started):
          driver    process 0.0 | init 13.1 [13.1] | data 19.2 [6.1] | ray 24.0 [4.8]
          vllm      process 24.3 | init 27.0 [2.7] | engine_ready 60.2 [33.2]
    """
    width = max(len(name) for name in processes)
    lines = ["start-up (s after the command started; [s since the previous mark]):"]
    for name, marks in processes.items():
        parts, previous = [], None
        for mark, when in marks.items():
            step = "" if previous is None else f" [{when - previous:.1f}]"
            parts.append(f"{mark} {when - origin:.1f}{step}")
            previous = when
        lines.append(packed(parts, f"  {name:<{width}}  ", " | ", columns))
    return "\n".join(lines)
