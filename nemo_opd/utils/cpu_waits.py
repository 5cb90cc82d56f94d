"""Idle CPU threads that sleep instead of spinning: OpenMP's passive wait policy for a command.

    prefer_passive_waits()   # first thing in a command's main(), before torch is imported

torch's CPU kernels run on OpenMP threads, which by default spin for a while at the end of
each parallel region waiting for the next one. In one process on an idle machine that spin is
harmless; beside other busy threads and processes (the rollout producer, a worker per rank,
the grader and tool processes, another job) the spinning threads take the cores the others
need, and a step can take many times its CPU time. With OMP_WAIT_POLICY=PASSIVE an idle thread
sleeps at once. The runtime reads the variable when it loads (with torch), so this is set
before torch is imported, and a value the user has set is kept.
"""

import os
import sys

VARIABLE = "OMP_WAIT_POLICY"


def prefer_passive_waits() -> bool:
    """Set OMP_WAIT_POLICY=PASSIVE for this process and the processes it starts, unless the
    environment already sets it. Returns whether it takes effect here: False when torch was
    already imported (the runtime has read its setting; child processes still get it)."""
    os.environ.setdefault(VARIABLE, "PASSIVE")
    return "torch" not in sys.modules
