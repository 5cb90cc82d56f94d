"""A teacher with another tokenizer run by the run's own Ray workers: each replica renders,
scores and maps its own rows (Policy.score_rendered), and the answers are the driver's, bit for
bit (the same rows reach the same workers in the same microbatches). A tiny random model at
Llama 3's 128,256 ids grades a Qwen3 student's rollouts through Llama 3's real tokenizer and
chat template, over two data-parallel replicas and over one replica of two tensor-parallel
ranks (where the second rank renders only for the forward)."""

import os

import pytest
import torch
from real_tokenizers import HOSTILE_TEXTS
from tiny_policies import cpu_cluster, executor_for, policy_config, tiny_qwen3
from transformers import AutoModelForCausalLM

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.policy.policy import Policy
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.scoring.rendering import TeacherRendering
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher
from nemo_opd.teachers.in_process import InProcessTeacher

LLAMA3_IDS = 128_256


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(the student's rollouts, the rendering for a Llama 3 teacher, its model's directory)."""
    if not os.environ.get("CI"):  # in CI the dev group installs them: a missing one fails
        pytest.importorskip("dashscope", reason="the vocabularies' packages: uv sync --group dev")
    import real_tokenizers

    student, teacher = real_tokenizers.load("qwen3"), real_tokenizers.load("llama3")
    formatter = ChatFormatter(student)
    logs = []
    for text in (HOSTILE_TEXTS[0], HOSTILE_TEXTS[3], HOSTILE_TEXTS[7]):
        ids = student(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        turn = {"role": "assistant", "content": text, "token_ids": [*ids, student.eos_token_id]}
        logs.append([*formatter.prompt_log("What is 7 * 6?"), turn])
    batch = flatten_message_logs(logs, student.pad_token_id)
    rendering = TeacherRendering(student, ChatFormatter(teacher), LLAMA3_IDS)
    torch.manual_seed(5)
    model = AutoModelForCausalLM.from_config(tiny_qwen3(True, LLAMA3_IDS), dtype=torch.float32)
    model.save_pretrained(path := tmp_path_factory.mktemp("llama3_ids"))
    return Rollouts(batch, logs, [{}] * len(logs)), rendering, str(path)


@pytest.mark.parametrize(("workers", "tp"), [(2, 1), (2, 2)], ids=["dp2", "tp2"])
def test_workers_render_and_map_as_the_driver_does(pair, workers, tp):
    rollouts, rendering, model = pair
    cfg = policy_config(
        model,
        optimizer=None,
        scheduler=None,
        max_total_sequence_length=256,
        dtensor_cfg__tensor_parallel_size=tp,
    )
    policy = Policy(
        cfg,
        cpu_cluster(workers),
        optimizer=False,
        name=f"teacher_tp{tp}",
        executor=executor_for(workers),
    )
    try:
        teacher = InProcessTeacher(policy)
        on_driver = CrossTokenizerTeacher(teacher, rendering)
        in_workers = CrossTokenizerTeacher(teacher, rendering, workers=policy)
        need = TeacherNeed(topk=8, sampled=True)
        expected, got = on_driver.score(rollouts, need), in_workers.score(rollouts, need)
        for name, tensor in expected.tensors().items():
            assert torch.equal(got.tensors()[name], tensor), name
        assert (expected.topk_indices >= 0).any()  # graded positions, not only empty slots
        assert in_workers.take_metrics() == on_driver.take_metrics()
    finally:
        policy.shutdown()
