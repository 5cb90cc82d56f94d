"""StudentEvaluation: in the background it evaluates the chunks in a worker thread, one at a
time in the order submitted, so its token-weighted means equal evaluating each chunk at once;
a chunk's error reaches finish(), and close() stops the thread however validation ends."""

import threading
import time
from types import SimpleNamespace

import pytest
import torch

from nemo_opd.algorithms.student_evaluation import StudentEvaluation
from nemo_opd.data.batching import TensorBatch


class Student:
    """Answers evaluate() from the batch's own numbers (so each chunk's answer differs) and
    records the order and the thread of the calls; raises on a batch marked to fail."""

    def __init__(self) -> None:
        self.calls = []

    def evaluate(self, batch, loss_fn):
        time.sleep(0.02)  # long enough for the caller to run ahead in the background
        value = float(batch["values"].sum())
        if value < 0:
            raise RuntimeError("worker died")
        self.calls.append((value, threading.current_thread()))
        tokens = float(batch["values"].numel())
        return {
            "global_valid_toks": tokens,
            "loss": value / tokens,
            "forward_kl": value,
            "reverse_kl": 2 * value,
            "top1_agreement": 1 / value,
        }


def chunks():
    """Four chunks of two equal rows: [1], [1, 2], [1, 2, 3], [1, 2, 3, 4]."""
    return [TensorBatch(values=torch.arange(1.0, 2.0 + n).repeat(2, 1)) for n in range(4)]


def run(background, groups=None):
    student = Student()
    evaluation = StudentEvaluation(SimpleNamespace(student=student, val_loss_fn=None), background)
    for batch in chunks():
        evaluation.submit(batch, groups or {"": None})
    metrics, seconds = evaluation.finish()
    return metrics, seconds, student.calls


def test_background_evaluates_in_order_in_one_thread_with_the_same_means():
    at_once, _, calls_at_once = run(background=False)
    behind, seconds, calls_behind = run(background=True)
    assert behind == at_once
    assert [value for value, _ in calls_behind] == [value for value, _ in calls_at_once]
    assert {thread for _, thread in calls_at_once} == {threading.main_thread()}
    (worker,) = {thread for _, thread in calls_behind}
    assert worker is not threading.main_thread()
    assert seconds >= 4 * 0.02
    assert not worker.is_alive()  # finish() stopped it
    # the means are token-weighted over the chunks
    tokens = [2, 4, 6, 8]
    values = [2.0, 6.0, 12.0, 20.0]
    assert at_once["validation/forward_kl"] == pytest.approx(
        sum(t * v for t, v in zip(tokens, values, strict=True)) / sum(tokens)
    )


def test_each_teachers_rows_apart():
    groups = {"a": torch.tensor([0]), "b": torch.tensor([1])}
    metrics, _, calls = run(background=True, groups=groups)
    assert len(calls) == 8
    assert {"validation/teacher/a/loss", "validation/teacher/b/loss"} <= set(metrics)
    # row 0 of each chunk: sums 1, 3, 6, 10 over 1, 2, 3, 4 tokens
    assert metrics["validation/teacher/a/forward_kl"] == pytest.approx(65 / 10)
    assert metrics["validation/forward_kl"] == pytest.approx(65 / 10)


def test_an_error_reaches_finish_after_the_chunks_before_it():
    student = Student()
    evaluation = StudentEvaluation(SimpleNamespace(student=student, val_loss_fn=None), True)
    evaluation.submit(TensorBatch(values=torch.ones(1, 2)), {"": None})
    evaluation.submit(TensorBatch(values=-torch.ones(1, 2)), {"": None})
    with pytest.raises(RuntimeError, match="worker died"):
        evaluation.finish()
    assert [value for value, _ in student.calls] == [2.0]
    evaluation.close()  # idempotent


def test_close_without_finish_stops_the_thread():
    student = Student()
    evaluation = StudentEvaluation(SimpleNamespace(student=student, val_loss_fn=None), True)
    evaluation.submit(TensorBatch(values=torch.ones(1, 2)), {"": None})
    before = set(threading.enumerate())
    evaluation.close()
    assert not any(t.name.startswith("validation-student") for t in threading.enumerate())
    assert set(threading.enumerate()) <= before
