"""StopSignal: the first SIGTERM or SIGINT (Ctrl-C) requests a stop, a second one stops at once
(SIGTERM by its default action, SIGINT as KeyboardInterrupt), a signal the process ignores stays
ignored, and the previous handlers are back outside the block."""

import io
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from nemo_opd.utils.stop_signal import StopSignal


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(
    ("signum", "notice"),
    [
        (signal.SIGTERM, "SIGTERM: the run stops after this step"),
        (signal.SIGINT, "SIGINT (Ctrl-C): the run stops after this step"),
    ],
)
def test_first_signal_requests_a_stop(signum, notice, monkeypatch):
    terminal = Terminal()  # the notice is wrapped at a terminal's width
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    before = {other: signal.getsignal(other) for other in (signal.SIGTERM, signal.SIGINT)}
    with StopSignal() as stop:
        assert not stop.requested and stop.received is None
        os.kill(os.getpid(), signum)
        assert stop.requested and stop.received == signum  # the process is still here
    assert {other: signal.getsignal(other) for other in before} == before
    err = terminal.getvalue()
    assert notice in err
    assert all(len(line) <= 80 for line in err.splitlines()), err


def test_second_sigint_raises_keyboard_interrupt():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), StopSignal() as stop:
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.received == signal.SIGINT
        os.kill(os.getpid(), signal.SIGINT)
    assert signal.getsignal(signal.SIGINT) is before


def test_an_ignored_sigint_stays_ignored(monkeypatch):
    # A job a shell starts in the background ignores Ctrl-C; so does its run.
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with StopSignal() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            assert not stop.requested
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


def test_second_sigterm_stops_at_once():
    code = textwrap.dedent(
        """
        import os, signal
        from nemo_opd.utils.stop_signal import StopSignal
        with StopSignal() as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            print("first handled", stop.requested, flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            print("still alive", flush=True)
        """
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == -signal.SIGTERM
    assert result.stdout == "first handled True\n"
    assert "SIGTERM again: stopping now" in result.stderr
