"""The teacher with another tokenizer gives the same answers, bit for bit, wherever it runs:
rendered and mapped on the driver for the whole batch (a served teacher, and every teacher
before), or by each data-parallel worker on its own rows (an in-process teacher:
Policy.score_rendered), on the real tokenizer pairs over hostile text, several turns, a
response cut mid-character, a row the template refuses and a row cut at the teacher's longest.

The workers are played in this process by the code they run: Policy's cut of the rows and
conversations (rendered_shards), score_rendered on each shard with the rendering as a worker
receives it (pickled), and Policy's join of the answers (joined).
"""

import pickle

import pytest
import torch
from xtok_teachers import K, PositionTeacher

from nemo_opd.data.batching import TensorBatch
from nemo_opd.policy.policy import joined, rendered_shards
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.scoring.rendering import TeacherRendering, score_rendered
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher

PAIRS = [("qwen3", "llama3"), ("qwen3", "tekken"), ("llama3", "qwen3"), ("mistral_sp", "qwen3")]
"""(student, teacher)."""


class LocalWorkers:
    """Policy's set_rendering and score_rendered, its dp replicas played in this process."""

    def __init__(self, teacher: PositionTeacher, dp: int) -> None:
        self.teacher, self.dp, self.rendering = teacher, dp, None

    def set_rendering(self, rendering: TeacherRendering) -> None:
        self.rendering = pickle.loads(pickle.dumps(rendering))  # as Ray sends it

    def score_rendered(self, data, message_logs, *, topk, temperature, logprobs):
        pickle.dumps(message_logs)  # what Ray sends a worker: plain data
        need = TeacherNeed(topk=topk, sampled=logprobs, temperature=temperature)

        def score_rows(rows):
            return self.teacher.score(Rollouts(rows.batch, rows.logs, []), need)

        payloads, size = rendered_shards(data, message_logs, self.dp)
        answers = [
            score_rendered(self.rendering, TensorBatch(rows), logs, need, score_rows)
            for rows, logs in payloads
        ]
        return joined(answers, size)


@pytest.mark.parametrize(("student_name", "teacher_name"), PAIRS)
def test_workers_give_the_drivers_answers_bit_for_bit(xtok_setup, student_name, teacher_name):
    # the longest row cut 8 tokens short (a served teacher's context): conftest.py
    rendering, rollouts, vocab = xtok_setup(student_name, teacher_name)
    inner = PositionTeacher(vocab)
    on_driver = CrossTokenizerTeacher(inner, rendering)
    workers = LocalWorkers(inner, dp=1)
    in_workers = CrossTokenizerTeacher(inner, rendering, workers=workers)  # sent once: seconds
    for dp in (1, 3):  # 13 rows: 3 shards of 5, 5 and 3 rows and 2 padding rows
        workers.dp = dp
        _check_workers(on_driver, in_workers, rollouts)


def _check_workers(on_driver, in_workers, rollouts) -> None:
    for need in (TeacherNeed(topk=K), TeacherNeed(sampled=True), TeacherNeed(topk=K, sampled=True)):
        expected, got = on_driver.score(rollouts, need), in_workers.score(rollouts, need)
        assert expected.tensors().keys() == got.tensors().keys()
        for name, tensor in expected.tensors().items():
            assert torch.equal(got.tensors()[name], tensor), name
    metrics = on_driver.take_metrics()
    assert in_workers.take_metrics() == metrics
    assert metrics["teacher/xtok_truncated_rows"] > 0
    assert 0.0 < metrics["teacher/xtok_graded_share"] < 1.0
