"""Progress lines of long setup work (nemo_opd.data.progress), on a clock the test moves."""

from nemo_opd.data.progress import CountProgress


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_short_work_prints_nothing():
    clock, lines = Clock(), []
    progress = CountProgress("data: rendering the train prompts", 10.0, clock, lines.append)
    for done in range(0, 5000, 256):
        clock.now += 0.01
        progress.update(done, 5000)
    progress.finish(5000)
    assert lines == [] and progress.lines == 0


def test_long_work_prints_a_line_each_period_and_a_closing_line():
    """The clock starts at the first update (the work may be set up long before it starts)."""
    clock, lines = Clock(), []
    clock.now += 50
    progress = CountProgress("data: tokenizing the train prompts", 10.0, clock, lines.append)
    for done in range(0, 400_000, 20_000):
        clock.now += 1.5
        progress.update(done, 400_000)
    clock.now += 0.25
    progress.finish(400_000)
    assert lines == [
        "data: tokenizing the train prompts: 140,000 of 400,000 (10 s)",
        "data: tokenizing the train prompts: 280,000 of 400,000 (21 s)",
        "data: tokenizing the train prompts: 400,000 in 28.8 s",
    ]
    assert progress.lines == 2


def test_lines_fit_80_columns(monkeypatch):
    monkeypatch.setattr("sys.stdout.isatty", lambda: False)  # the console of a log file
    clock, lines = Clock(), []
    what = "data: rendering the validation prompts of a dataset with a long name indeed"
    progress = CountProgress(what, 10.0, clock, lines.append)
    progress.update(0, 987_654_321)
    clock.now += 11
    progress.update(123_456_789, 987_654_321)
    assert lines and all(len(row) <= 80 for line in lines for row in line.splitlines())
