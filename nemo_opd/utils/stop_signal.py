"""Stopping a run at a clean point on SIGTERM (what schedulers send before they preempt a job).

While a StopSignal is active, the first SIGTERM does not kill the process: it sets `requested`,
and the loop, which checks it after every step, saves a checkpoint and returns. A second
SIGTERM stops at once (the default action), for a run that must end now. Outside the block the
previous handler is back. Python runs signal handlers in the main thread between bytecodes, so
a step in progress (blocked in a call to the workers) finishes first.
"""

import signal
import sys
import threading
from types import FrameType


class StopSignal:
    """Context manager: SIGTERM (or `signum`) requests a stop instead of killing the process."""

    def __init__(self, signum: int = signal.SIGTERM) -> None:
        self.signum = signum
        self.requested = False
        self._previous = None

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():  # handlers live there only
            self._previous = signal.signal(self.signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._previous is not None:
            signal.signal(self.signum, self._previous)
            self._previous = None

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.requested:
            print(f"{name} again: stopping now", file=sys.stderr, flush=True)
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.requested = True
        print(
            f"{name}: the run stops after this step, with a checkpoint "
            f"(send {name} again to stop at once)",
            file=sys.stderr,
            flush=True,
        )
