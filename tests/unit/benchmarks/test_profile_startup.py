"""profile_startup's table: each point's figures with their increase since the point before."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "benchmarks"))

import profile_startup  # noqa: E402


def test_the_table_shows_each_figure_and_its_increase():
    rows = [("profiler started", 0.05, 0.03, 0.03), ("loop imported", 4.5, 4.1, 4.0)]
    assert profile_startup.format_table(rows).splitlines()[2:] == [
        "| profiler started | 0.05 (+0.05) | 0.03 (+0.03) | 0.03 (+0.03) |",
        "| loop imported | 4.50 (+4.45) | 4.10 (+4.07) | 4.00 (+3.97) |",
    ]


def test_a_mark_from_another_thread_repeats_the_main_threads_cpu():
    import threading

    marks = profile_startup.Marks(started=0.0)
    marks.note("main")
    thread = threading.Thread(target=marks.note, args=("elsewhere",))
    thread.start()
    thread.join()
    assert marks.rows[1][3] == marks.rows[0][3] and marks.rows[1][0] == "elsewhere"
