"""Start-up marks: the process's start time from the OS, marks in order, report and metrics."""

import subprocess
import sys
import time

from nemo_opd.utils.startup import (
    StartupMarks,
    format_startup_report,
    process_start_time,
    startup_metrics,
)


def test_process_start_time_is_when_the_process_started():
    """A child that sleeps before asking: its answer is its launch time, not the time it asks."""
    code = (
        "import time; time.sleep(1.0); from nemo_opd.utils.startup import process_start_time; "
        "print(process_start_time(), time.time())"
    )
    launched = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    started, asked = (float(v) for v in out.stdout.split())
    assert abs(started - launched) < 0.5  # /proc counts in clock ticks
    assert asked - started >= 0.9


def test_marks_keep_their_order_and_start_with_the_process():
    marks = StartupMarks()
    marks.note("data")
    marks.note("ray")
    recorded = marks.as_dict()
    assert list(recorded) == ["process", "init", "data", "ray"]
    assert recorded["process"] <= recorded["init"] <= recorded["data"] <= recorded["ray"]
    if process_start_time() is not None:
        assert recorded["process"] < recorded["init"]  # this test process started earlier


def test_report_and_metrics_count_from_the_origin():
    processes = {
        "driver": {"process": 100.0, "init": 113.0, "ray": 120.5},
        "vllm.0": {"process": 121.0, "engine_ready": 160.375},
    }
    assert startup_metrics(100.0, processes) == {
        "timing/startup/driver/process": 0.0,
        "timing/startup/driver/init": 13.0,
        "timing/startup/driver/ray": 20.5,
        "timing/startup/vllm.0/process": 21.0,
        "timing/startup/vllm.0/engine_ready": 60.375,
    }
    report = [
        " ".join(line.split()) for line in format_startup_report(100.0, processes).splitlines()
    ]
    assert report[1] == "driver process 0.0 | init 13.0 [13.0] | ray 20.5 [7.5]"
    assert report[2] == "vllm.0 process 21.0 | engine_ready 60.4 [39.4]"
