"""Stopping a run at a clean point on SIGTERM (what schedulers send before they preempt a job)
or SIGINT (Ctrl-C at the terminal).

While a StopSignal is active, the first of these signals does not end the process: it records
which signal came (`received`), and the loop, which checks `requested` after every step, saves
a checkpoint and returns. A second one stops at once, for a run that must end now: a second
SIGTERM by its default action, a second SIGINT by raising KeyboardInterrupt in the main thread
(the command line reports it in one line: nemo_opd.cli). Outside the block the previous
handlers are back; a signal the process ignores (SIGINT of a job started in the background by
a shell, or under nohup) stays ignored. Python runs signal handlers in the main thread between
bytecodes, so a step in progress (blocked in a call to the workers) finishes first.
"""

import signal
import threading
from collections.abc import Sequence
from types import FrameType

from nemo_opd.utils.error_output import print_fitted

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
"""The signals that ask a run to stop after its step in progress."""


def signal_name(signum: int) -> str:
    """How a stop signal is named to the user: "SIGTERM", "SIGINT (Ctrl-C)"."""
    name = signal.Signals(signum).name
    return f"{name} (Ctrl-C)" if signum == signal.SIGINT else name


class StopSignal:
    """Context manager: SIGTERM or SIGINT (or the given `signums`) requests a stop instead of
    ending the process."""

    def __init__(self, signums: Sequence[int] = STOP_SIGNALS) -> None:
        self.signums = tuple(signums)
        self.received: int | None = None
        """The first stop signal received in the block (None: none)."""
        self._previous: dict[int, object] = {}

    @property
    def requested(self) -> bool:
        """Whether a stop signal came."""
        return self.received is not None

    def __enter__(self) -> "StopSignal":
        if threading.current_thread() is threading.main_thread():  # handlers live there only
            for signum in self.signums:
                if signal.getsignal(signum) is not signal.SIG_IGN:  # e.g. a nohup'd run's SIGINT
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal_name(signum)
        if self.requested:
            print_fitted(f"{name} again: stopping now")
            if signum == signal.SIGINT:
                signal.signal(signum, signal.default_int_handler)
                raise KeyboardInterrupt
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.received = signum
        again = "press Ctrl-C again" if signum == signal.SIGINT else f"send {name} again"
        notice = f"{name}: the run stops after this step, with a checkpoint ({again} to stop at"
        notice += " once)"
        print_fitted(notice)
