"""The run's own set-up lines fit the console (80 columns when printing to a file).

Before: at 80 columns the tiny default's "workers: ..." line took 106 columns, "data: ..." 98
and the start-up report's driver row 282."""

from nemo_opd.distributed.nodes import format_placement
from nemo_opd.utils.startup import format_startup_report
from nemo_opd.utils.text_width import CONSOLE_WIDTH, console_width, packed, wrapped

DRIVER = {
    "process": 0.0,
    "init": 12.8,
    "prompts_rendered": 16.0,
    "vllm_launched": 28.9,
    "data": 29.1,
    "workers_launched": 29.5,
    "policy_ready": 29.6,
    "teacher_ready": 29.7,
    "vllm_ready": 29.8,
    "environments_ready": 29.9,
    "setup_done": 30.0,
}


def test_a_file_gets_80_columns():
    assert console_width() == CONSOLE_WIDTH == 80  # pytest's stdout is not a terminal


def test_lines_are_wrapped_at_words_and_a_long_path_is_kept_whole():
    text = "workers: one process (cluster.executor local, no Ray): the student, the teacher, "
    text += "1 vLLM engine on 1 thread"
    lines = wrapped(text).splitlines()
    assert [len(line) <= 80 for line in lines] == [True, True]
    assert " ".join(line.strip() for line in lines) == text
    path = "/data/" + "x" * 100
    assert wrapped(f"model: {path}", width=40).splitlines() == ["model:", f"  {path}"]


def test_packed_parts_keep_their_separator_at_the_end_of_a_line():
    assert packed(["aaa", "bbb", "ccc"], "head ", " | ", width=16) == ("head aaa | bbb |\n     ccc")
    assert packed(["a", "b"], "x: ", ", ", width=80) == "x: a, b"


def test_the_start_up_report_fits_80_columns_and_keeps_every_mark():
    processes = {"driver": DRIVER, "vllm.0": {"process": 0.0, "init": 16.0, "engine_ready": 28.9}}
    report = format_startup_report(0.0, processes)
    assert max(len(line) for line in report.splitlines()) <= 80
    for mark in DRIVER:
        assert f"{mark} " in report
    assert len(report.splitlines()) > 3  # the driver's row went on over several lines
    wide = format_startup_report(0.0, processes, columns=400).splitlines()
    assert len(wide) == 3


def test_a_placement_of_many_workers_fits():
    workers = {"policy": ["n1"] * 8, "teacher": ["n1"] * 8, "vllm": ["n1"] * 4}
    record = {"nodes": {"n1" + "0" * 30: "10.0.0.1"}, "workers": workers}
    record["workers"] = {
        name: [next(iter(record["nodes"]))] * len(w) for name, w in workers.items()
    }
    text = format_placement(record)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert text.count("policy ") == 8 and "vllm 3" in text
