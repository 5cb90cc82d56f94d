"""The error that ends a command, as it prints (nemo_opd.utils.error_output): one line per
problem into a file, wrapped at the width of a terminal, secrets redacted either way."""

import io

import pytest

from nemo_opd.errors import SetupError
from nemo_opd.utils.error_output import print_error, print_interrupted
from nemo_opd.utils.text_width import wrapped_lines

PROBLEMS = SetupError(
    "the run's inputs have 2 problems:\n"
    "  data.train_path (/home/someone/projects/math/data/train.jsonl): line 1 has no column "
    "'problem' (data.prompt_key); columns: final, question. Set data.prompt_key or fix the row\n"
    "  data.val_path (/home/someone/projects/math/data/val.jsonl): line 1 has no column "
    "'problem' (data.prompt_key); columns: final, question. Set data.prompt_key or fix the row"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_into_a_file_each_problem_stays_one_line(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    print_error(PROBLEMS)
    assert stderr.getvalue() == f"error: {PROBLEMS}\n"


@pytest.mark.parametrize("columns", [80, 60])
def test_on_a_terminal_each_line_is_wrapped_at_its_width(monkeypatch, columns):
    stderr = Terminal()
    monkeypatch.setattr("sys.stderr", stderr)
    monkeypatch.setenv("COLUMNS", str(columns))
    print_error(PROBLEMS)
    rows = stderr.getvalue().splitlines()
    assert len(rows) > 3 and all(len(row) <= columns for row in rows)
    # the same words in the same order; each problem's continuation indented under it
    assert " ".join(" ".join(rows).split()) == " ".join(f"error: {PROBLEMS}".split())
    problems = [i for i, row in enumerate(rows) if row.startswith("  data.")]
    assert len(problems) == 2
    assert all(row.startswith("    ") for row in rows[problems[0] + 1 : problems[1]])


def test_secrets_are_redacted_either_way(monkeypatch):
    for stderr in (io.StringIO(), Terminal()):
        monkeypatch.setattr("sys.stderr", stderr)
        print_error(SetupError("teacher.server.base_url http://user:hunter2@host:8000 refused"))
        assert "hunter2" not in stderr.getvalue() and "error: teacher.server" in stderr.getvalue()


def test_a_word_longer_than_the_width_is_kept_whole():
    path = "/a/" + "long" * 30 + "/train.jsonl"
    text = wrapped_lines(f"error: {path} is not there", 40)
    assert path in text.splitlines()[0] + text.splitlines()[1]
    assert text.replace("\n", " ").split() == f"error: {path} is not there".split()


def test_ctrl_c_is_reported_like_an_error(monkeypatch):
    stderr = io.StringIO()
    monkeypatch.setattr("sys.stderr", stderr)
    consequence = "nothing since the run's last checkpoint is saved " * 3
    print_interrupted(consequence)
    assert stderr.getvalue() == f"stopped at once by SIGINT (Ctrl-C): {consequence}\n"
    terminal = Terminal()
    monkeypatch.setattr("sys.stderr", terminal)
    monkeypatch.setenv("COLUMNS", "80")
    print_interrupted(consequence)
    rows = terminal.getvalue().splitlines()
    assert len(rows) > 1 and all(len(row) <= 80 for row in rows)
