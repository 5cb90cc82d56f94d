"""Setup's in-process teachers with another tokenizer render in their own workers: the teacher
that setup builds ships the student's conversations to its Policy (score_rendered) and never
renders, scores or maps on the driver; alone and behind RoutedTeachers. Policy is replaced by a
recorder, so no worker starts."""

import pytest
import torch

from nemo_opd.algorithms import setup_teachers
from nemo_opd.config import load_config
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.scoring.rendering import XTOK_COUNTS, TeacherRendering
from nemo_opd.scoring.xtok_rows import COUNTS

K = 4


class RecordingPolicy:
    """Policy's teacher calls, recorded; score_rendered answers zeros of the right shapes."""

    def __init__(self, cfg, cluster, **kwargs) -> None:
        self.calls: list[tuple[str, object]] = []

    def set_rendering(self, rendering: TeacherRendering) -> None:
        self.calls.append(("set_rendering", rendering))

    def score_rendered(self, data, message_logs, *, topk, temperature, logprobs) -> dict:
        self.calls.append(("score_rendered", message_logs))
        rows, width = data["input_ids"].shape
        return {
            "topk_logprobs": torch.zeros(rows, width, topk),
            "topk_indices": torch.zeros(rows, width, topk, dtype=torch.int32),
            XTOK_COUNTS: torch.zeros(rows, len(COUNTS), dtype=torch.float64),
        }

    def score(self, data, **kwargs) -> dict:
        raise AssertionError("the teacher scored rows the driver rendered")


@pytest.mark.parametrize("config", ["distillation_tiny.yaml", "distillation_tiny_routed.yaml"])
def test_in_process_teachers_with_another_tokenizer_render_in_their_workers(
    chat_tokenizer, monkeypatch, config
):
    cfg = load_config(f"examples/configs/{config}")
    rendering = TeacherRendering(chat_tokenizer, ChatFormatter(chat_tokenizer))
    sections = ["teacher"] if cfg.teachers is None else [f"teachers.{n}" for n in cfg.teachers]
    monkeypatch.setattr(setup_teachers, "Policy", RecordingPolicy)
    monkeypatch.setattr(TeacherRendering, "teacher_rows", _not_on_the_driver)
    teacher = setup_teachers.start_teachers(cfg, dict.fromkeys(sections, rendering), 1, None, None)

    formatter = ChatFormatter(chat_tokenizer)
    logs = []
    for problem in ("7 * 6", "12 + 30"):
        ids = chat_tokenizer("42", add_special_tokens=False)["input_ids"]
        turn = {"role": "assistant", "content": "42", "token_ids": ids, "generation_logprobs": []}
        logs.append([*formatter.prompt_log(f"What is {problem}?"), turn])
    names = list(cfg.named_teachers)
    metadata = [{"teacher": names[row % len(names)]} for row in range(len(logs))]
    rollouts = Rollouts(flatten_message_logs(logs, 0), logs, metadata)
    scores = teacher.score(rollouts, TeacherNeed(topk=K))
    assert scores.topk_logprobs.shape == (*rollouts.batch["input_ids"].shape, K)

    policies = teacher.workers().values()
    assert len(policies) == len(names)
    for policy in policies:  # each route's workers got its rendering, then its conversations
        assert [name for name, _ in policy.calls] == ["set_rendering", "score_rendered"]
        shipped = policy.calls[1][1]
        assert shipped and all(log in [_without_logprobs(row) for row in logs] for log in shipped)


def _not_on_the_driver(self, logs):
    raise AssertionError("the driver rendered the conversations")


def _without_logprobs(log: list[dict]) -> list[dict]:
    return [{k: v for k, v in message.items() if k != "generation_logprobs"} for message in log]
