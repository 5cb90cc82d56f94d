"""With the local executor the workers' start-up output (vLLM's warnings, torch's C++
warnings, weight-loading bars) goes to logger.log_dir/workers.log, as a Ray worker's goes to
its own log files, and the run's own lines stay on the console.

Before: at 80 columns a run of the tiny default printed ~15 lines of vLLM and torch warnings of
120-280 characters between its own set-up lines."""

import os
import subprocess
import sys

import pytest

from nemo_opd.utils.worker_output import TAIL_LINES, start_up_output_to

CHILD = """
import os, subprocess, sys
from pathlib import Path
from nemo_opd.utils.worker_output import start_up_output_to
with start_up_output_to(Path(sys.argv[1])):
    print("the run's own line")
    print("a python warning", file=sys.stderr)
    os.write(2, b"a C-level warning\\n")
    grandchild = "import os; os.write(2, b'a child process warning\\\\n')"
    subprocess.run([sys.executable, "-c", grandchild], check=True)
print("after", file=sys.stderr)
"""


def test_standard_error_of_the_process_and_its_children_goes_to_the_log(tmp_path):
    log = tmp_path / "logs" / "workers.log"
    run = [sys.executable, "-c", CHILD, str(log)]
    done = subprocess.run(run, capture_output=True, text=True, timeout=120, check=True)
    assert " ".join(done.stdout.split()) == (
        f"the run's own line workers' start-up messages (engines, torch, the models): {log}"
    )
    assert max(len(line) for line in done.stdout.splitlines()) <= max(80, len(str(log)) + 2)
    assert done.stderr == "after\n"  # standard error is the console's again
    assert log.read_text().splitlines() == [
        "a python warning",
        "a C-level warning",
        "a child process warning",
    ]


def test_a_quiet_start_names_no_log_and_a_failed_one_shows_its_last_lines(tmp_path, capfd):
    log = tmp_path / "workers.log"
    log.write_text("an earlier run's line\n")
    with start_up_output_to(log):
        pass
    assert capfd.readouterr().out == ""  # nothing new was written
    with pytest.raises(RuntimeError, match="engine failed"), start_up_output_to(log):
        for index in range(TAIL_LINES + 5):
            os.write(2, f"line {index}\n".encode())
        raise RuntimeError("engine failed")
    err = capfd.readouterr().err.splitlines()
    assert err[0] == f"the workers' last start-up messages ({log}):"
    assert err[1:] == [f"  line {index}" for index in range(5, TAIL_LINES + 5)]
