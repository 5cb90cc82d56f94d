"""score_rollout asks the teacher, in one call, for what the objective reads, and only at the
trained positions (TeacherNeed.trained_only): the loss mask's positions are the only ones any
loss or metric reads, and an in-process teacher then skips the prompt's LM-head work."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from nemo_opd.algorithms.step_rollouts import score_rollout
from nemo_opd.config import load_config
from nemo_opd.rollouts.multi_turn import RolloutResult
from nemo_opd.scoring.base import TeacherScores
from nemo_opd.teachers.in_process import InProcessTeacher

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"


class Recorder:
    """A teacher that records what it was asked and answers zeros of the asked shapes."""

    def __init__(self) -> None:
        self.needs = []

    def score(self, rollouts, need):
        self.needs.append(need)
        shape = rollouts.batch["input_ids"].shape
        return TeacherScores(
            topk_logprobs=torch.zeros(*shape, need.topk) if need.topk else None,
            topk_indices=torch.zeros(*shape, need.topk, dtype=torch.int32) if need.topk else None,
            logprobs=torch.zeros(shape) if need.sampled else None,
            hidden_states=torch.zeros(*shape, 4) if need.hidden else None,
        )


def rollout() -> RolloutResult:
    log = [
        {"role": "user", "content": "1 + 1?", "token_ids": [5, 6, 7]},
        {"role": "assistant", "content": "2", "token_ids": [8, 9]},
    ]
    return RolloutResult([log], torch.zeros(1), torch.zeros(1, dtype=torch.bool), [{}])


@pytest.mark.parametrize(
    ("config", "asked"),
    [
        ("distillation_tiny.yaml", {"topk": 16, "sampled": False, "hidden": False}),
        ("opd_rl_tiny.yaml", {"topk": 0, "sampled": True, "hidden": False}),
        ("distillation_tiny_full_vocab.yaml", {"topk": 0, "sampled": False, "hidden": True}),
    ],
)
def test_the_teacher_is_asked_for_the_trained_positions_only(config, asked):
    teacher = Recorder()
    state = SimpleNamespace(
        cfg=load_config(CONFIGS / config, []),
        formatter=SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0)),
        teacher=teacher,
    )
    batch, _ = score_rollout(state, rollout())
    (need,) = teacher.needs
    assert need.trained_only
    assert {"topk": need.topk, "sampled": need.sampled, "hidden": need.hidden} == asked
    assert batch["token_mask"].tolist() == [[0, 0, 0, 1, 1]]  # what trained_only reads


def test_an_in_process_teacher_passes_the_ask_to_its_workers():
    asked = {}

    class Workers:
        def score(self, batch, **kwargs):
            asked.update(kwargs)
            return {"logprobs": torch.zeros(batch["input_ids"].shape)}

    teacher = InProcessTeacher(Workers())
    batch, _ = score_rollout(
        SimpleNamespace(
            cfg=load_config(CONFIGS / "opd_rl_tiny.yaml", []),
            formatter=SimpleNamespace(tokenizer=SimpleNamespace(pad_token_id=0)),
            teacher=teacher,
        ),
        rollout(),
    )
    assert asked == {
        "topk": 0, "temperature": 1.0, "logprobs": True, "hidden": False, "trained_only": True,
    }  # fmt: skip
    assert batch["teacher_logprobs"].shape == (1, 5)
