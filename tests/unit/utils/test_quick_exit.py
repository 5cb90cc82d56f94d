"""quick_exit: the exit status, atexit handlers and buffered output of an orderly exit, and a
fall back to sys.exit while a non-daemon thread still runs."""

import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import atexit, sys, threading, time
    from nemo_opd.utils.quick_exit import quick_exit

    marker = sys.argv[1]
    atexit.register(lambda: open(marker, "a").write("atexit;"))
    sys.stdout.write("buffered, no newline")  # a pipe: block-buffered until flushed
    if sys.argv[2] == "thread":
        def late():
            time.sleep(0.3)
            open(marker, "a").write("thread;")
        threading.Thread(target=late).start()
    quick_exit(3)
    open(marker, "a").write("after;")  # never reached
    """
)


def _run(tmp_path, mode):
    marker = tmp_path / "marker"
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(marker), mode],
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done, marker.read_text() if marker.exists() else ""


def test_runs_atexit_flushes_output_and_keeps_the_status(tmp_path):
    done, marker = _run(tmp_path, "plain")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert marker == "atexit;"


def test_waits_for_a_running_thread_as_sys_exit_does(tmp_path):
    done, marker = _run(tmp_path, "thread")
    assert done.returncode == 3, done.stderr
    assert done.stdout == "buffered, no newline"
    assert marker == "thread;atexit;"
