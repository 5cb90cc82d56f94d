"""A teacher with another tokenizer scored by a pool of render workers
(nemo_opd.scoring.render_pool) gives the driver's thread's answers bit for bit, on the real
tokenizer pairs over hostile text, several turns, a response cut mid-character, a row the
template refuses and a row cut at the teacher's longest; and a worker that overruns, dies,
cannot start or raises ends the run with one line, after which no worker is left.

The workers' teachers come from tests/xtok_teachers.py, which the workers import (this folder's
parent on their PYTHONPATH, as a run's workers get the driver's).

A worker's start (torch's import, the rendering read back) is most of this module's time: each
pool has only the workers its test is about (two where rows are shared out or a teacher is
split, one elsewhere), and each pair's rendering and rows are built once for the session
(conftest.py's xtok_setup).
"""

import http.server
import os
import threading
from pathlib import Path

import pytest
import torch
from xtok_teachers import (
    CountingTeacher,
    DyingTeacher,
    K,
    PositionTeacher,
    StuckTeacher,
)

from nemo_opd.errors import RunError
from nemo_opd.scoring.base import TeacherNeed
from nemo_opd.scoring.render_pool import RenderPool, RenderPoolError
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher
from nemo_opd.teachers.served import ServedTeacher, ServedTeacherError

PAIRS = [("qwen3", "llama3"), ("qwen3", "tekken"), ("llama3", "qwen3"), ("mistral_sp", "qwen3")]
"""(student, teacher)."""
TESTS = Path(__file__).resolve().parents[2]
NEEDS = (TeacherNeed(topk=K), TeacherNeed(sampled=True), TeacherNeed(topk=K, sampled=True))


@pytest.fixture(autouse=True)
def teachers_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(TESTS))


@pytest.mark.parametrize(
    ("student_name", "teacher_name", "workers"),
    [(*PAIRS[0], 2), *((*pair, 1) for pair in PAIRS[1:])],
)
def test_the_pool_gives_the_drivers_answers_bit_for_bit(
    xtok_setup, student_name, teacher_name, workers
):
    """Every pair's answers through the pool's workers (the first pair's rows shared out between
    two, with a call of fewer rows than workers); then the pool's shutdown stops its workers
    and leaves no file, while the answers it mapped stay readable."""
    rendering, rollouts, vocab = xtok_setup(student_name, teacher_name)
    on_driver = CrossTokenizerTeacher(PositionTeacher(vocab), rendering)
    pool = RenderPool(rendering, [CountingTeacher(vocab) for _ in range(workers)])
    pooled = CrossTokenizerTeacher(PositionTeacher(vocab), rendering, pool=pool)
    try:
        for need in NEEDS:
            _check_same(on_driver.score(rollouts, need), pooled.score(rollouts, need))
        metrics = on_driver.take_metrics()
        got = pooled.take_metrics()
        assert got.pop("teacher/rows_scored") == 3 * 13  # each worker's teacher, summed
        assert got == metrics
        assert metrics["teacher/xtok_truncated_rows"] > 0
        assert 0.0 < metrics["teacher/xtok_graded_share"] < 1.0
        one_row = rollouts.select(torch.tensor([4]))  # fewer rows than workers, with two
        _check_same(on_driver.score(one_row, NEEDS[2]), pooled.score(one_row, NEEDS[2]))
        answer = pool.score(rollouts.batch, rollouts.message_logs, NEEDS[2])
        # setup, requests and answers' files removed once read or mapped
        assert [os.listdir(folder) for folder in pool._folders.values()] == [[]]
    finally:
        folders, pids = list(pool._folders.values()), pool.pids()
        pooled.shutdown()
    _check_shut_down(pool, folders, pids, answer, rollouts)


def _check_shut_down(pool, folders, pids, answer, rollouts) -> None:
    """After a pool's close (twice): no worker runs, no file or folder is left, and the last
    answer's tensors, mapped from files now removed, are still read whole."""
    assert answer["topk_logprobs"].shape == (13, rollouts.batch["input_ids"].shape[1], K)
    kept = {name: tensor.clone() for name, tensor in answer.items()}
    pool.close()
    assert _gone(pids) and not any(os.path.exists(folder) for folder in folders)
    for name, tensor in kept.items():  # the mapped pages outlive the files and the workers
        assert torch.equal(answer[name], tensor), name


def _check_same(expected, got) -> None:
    assert expected.tensors().keys() == got.tensors().keys()
    for name, tensor in expected.tensors().items():
        assert got.tensors()[name].dtype == tensor.dtype, name
        assert torch.equal(got.tensors()[name], tensor), name


def test_rows_the_template_refuses_count_against_max_unrendered_share(xtok_setup):
    rendering, rollouts, vocab = xtok_setup("qwen3", "mistral_sp")
    pool = RenderPool(rendering, [PositionTeacher(vocab)])
    pooled = CrossTokenizerTeacher(
        PositionTeacher(vocab), rendering, max_unrendered_share=0.0, pool=pool
    )
    try:  # row 12 has two user turns in a row, which Mistral's template refuses
        pooled.score(rollouts.select(torch.tensor([0, 12])), NEEDS[0])
        with pytest.raises(RunError, match=r"could not render 1 of the 2 conversations"):
            pooled.take_metrics()
    finally:
        pooled.shutdown()


def _failing(xtok_setup, teacher_class, **kwargs):
    rendering, rollouts, vocab = xtok_setup()
    return RenderPool(rendering, [teacher_class(vocab)], **kwargs), rollouts


def _gone(pids: list[int]) -> bool:
    """None of these processes runs (each was reaped by the pool)."""
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


def test_a_worker_that_overruns_is_stopped_with_one_line(xtok_setup):
    pool, rollouts = _failing(xtok_setup, StuckTeacher, timeout_s=1.0)
    pids = pool.pids()
    with pytest.raises(RenderPoolError, match=r"did not answer for rows 0-12 within its time-out"):
        pool.score(rollouts.batch, rollouts.message_logs, NEEDS[0])
    assert _gone(pids)
    with pytest.raises(RenderPoolError, match="the render pool was closed"):
        pool.score(rollouts.batch, rollouts.message_logs, NEEDS[0])


def test_a_worker_that_dies_is_named_with_one_line(xtok_setup):
    pool, rollouts = _failing(xtok_setup, DyingTeacher)
    pids = pool.pids()
    with pytest.raises(RenderPoolError) as raised:
        pool.score(rollouts.batch, rollouts.message_logs, NEEDS[0])
    message = str(raised.value)
    assert "died while scoring rows 0-12 (exit status -9, killed: out of memory?" in message
    assert "\n" not in message and "run the same command again" in message
    assert _gone(pids)


def test_a_worker_that_cannot_start_says_why(xtok_setup, monkeypatch):
    monkeypatch.delenv("PYTHONPATH")  # the worker cannot import its teacher's module
    pool, rollouts = _failing(xtok_setup, PositionTeacher)
    with pytest.raises(RenderPoolError) as raised:
        pool.score(rollouts.batch, rollouts.message_logs, NEEDS[0])
    message = str(raised.value)
    assert "died while starting (exit status 1): ModuleNotFoundError: No module named" in message
    assert "\n" not in message


class Refusing(http.server.BaseHTTPRequestHandler):
    """Answers every request with 503 and records its Authorization header."""

    seen: list = []

    def do_POST(self):
        Refusing.seen.append(self.headers.get("Authorization"))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


def test_a_teachers_error_in_the_workers_reaches_the_driver_as_itself(xtok_setup):
    """The run's own served teacher's client, pickled to the workers: its key is sent from
    there, the error it ends with is raised in the driver as itself, and the pool is then
    closed, no worker left."""
    rendering, rollouts, _ = xtok_setup()
    Refusing.seen = []
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Refusing) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{httpd.server_port}/v1"
        served = ServedTeacher(url, "m", max_retries=0, api_key="sk-pool-1", rows_per_request=13)
        pool = RenderPool(rendering, served.split(2))
        pids = pool.pids()
        try:
            with pytest.raises(ServedTeacherError, match=r"did not answer after 0 retries"):
                pool.score(rollouts.batch, rollouts.message_logs, NEEDS[0])
            assert _gone(pids)
        finally:
            pool.close()
            httpd.shutdown()
    assert Refusing.seen and set(Refusing.seen) == {"Bearer sk-pool-1"}
