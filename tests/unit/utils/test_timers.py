"""Timers: nested names, accumulation, reset, and timing recorded when a block raises."""

import time

import pytest

from nemo_opd.utils.timers import Timers


def test_nested_and_explicit_names_accumulate():
    timers = Timers()
    with timers.time("train"):
        for _ in range(2):
            with timers.time("generation"):
                time.sleep(0.01)
    with timers.time("train/total_step_time"):
        pass
    summary = timers.summary()
    assert set(summary) == {
        "timing/train",
        "timing/train/generation",
        "timing/train/total_step_time",
    }
    assert summary["timing/train/generation"] >= 0.02
    assert summary["timing/train"] >= summary["timing/train/generation"]


def test_summary_resets_unless_asked_not_to():
    timers = Timers()
    with timers.time("a"):
        pass
    assert "timing/a" in timers.summary(reset=False)
    assert "timing/a" in timers.summary()
    assert timers.summary() == {}


def test_a_raising_block_is_still_timed_and_unnests():
    timers = Timers()
    with pytest.raises(RuntimeError), timers.time("outer"), timers.time("inner"):
        raise RuntimeError
    with timers.time("after"):
        pass
    assert set(timers.summary()) == {"timing/outer", "timing/outer/inner", "timing/after"}


@pytest.mark.parametrize("name", ["", "/x", "x/"])
def test_bad_names_are_rejected(name):
    with pytest.raises(ValueError, match="timer name"), Timers().time(name):
        pass


def test_add_records_time_spent_elsewhere_under_the_enclosing_phase():
    timers = Timers()
    with timers.time("validation"):
        timers.add("student_eval", 0.25)
        timers.add("student_eval", 0.5)
    timers.add("outside", 1.0)
    summary = timers.summary()
    assert summary["timing/validation/student_eval"] == 0.75
    assert summary["timing/outside"] == 1.0
