"""StopSignal: the first SIGTERM requests a stop, a second one stops at once, and the previous
handler is back outside the block."""

import os
import signal
import subprocess
import sys
import textwrap

from nemo_opd.utils.stop_signal import StopSignal


def test_first_sigterm_requests_a_stop(capsys):
    before = signal.getsignal(signal.SIGTERM)
    with StopSignal() as stop:
        assert not stop.requested
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested  # the handler ran (the process is still here)
    assert signal.getsignal(signal.SIGTERM) is before
    assert "the run stops after this step" in capsys.readouterr().err


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
