"""SelfTeacher: the student's own workers as its teacher behind the Teacher interface, with
privileged context, against a separate frozen Policy started from the same weights (the tiny
student, its tokenizer, one worker each in this process: the local executor, which computes as
a Ray worker does)."""

import torch

from nemo_opd.config import ClusterConfig, PolicyConfig, TeacherConfig
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.engines.self_teacher_weights import TEACHER_DIR
from nemo_opd.policy.policy import Policy
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.teachers.in_process import InProcessTeacher
from nemo_opd.teachers.privileged import PrivilegedContext, PrivilegedTeacher
from nemo_opd.teachers.self_teacher import SelfTeacher
from nemo_opd.tiny.assets import resolve_pretrained

K = 4
TEMPLATE = "{prompt} {response}"
RECORDS = [
    {"prompt": "What is 3 + 4?", "answer": "7", "response": "3 + 4 = 7. \\boxed{7}"},
    {
        "prompt": "Mia has 9 bags with 28 cards in each. How many cards is that?",
        "answer": "252",
        "response": "9 * 28 = 252. \\boxed{252}",
    },
    {"prompt": "What is 100 - 1?", "answer": "99", "response": "100 - 1 = 99. \\boxed{99}"},
    {"prompt": "What is 12 + 30?", "answer": "42", "response": "12 + 30 = 42. \\boxed{42}"},
]
REPLIES = ["3 + 4 = 8. \\boxed{8}", "9 * 28 = 252.", "100 - 1 = 99. \\boxed{99}", "42"]
CLUSTER = ClusterConfig(num_nodes=1, gpus_per_node=1, device="cpu", cpus_per_worker=1)


def model_config(model_name: str, tokenizer: str) -> PolicyConfig:
    return PolicyConfig.model_validate(
        {
            "model_name": model_name,
            "tokenizer": {"name": tokenizer},
            "precision": "float32",
            "train_global_batch_size": 4,
            "train_micro_batch_size": 2,
            "logprob_batch_size": 4,
            "max_total_sequence_length": 96,
            "optimizer": {"lr": 1e-2, "weight_decay": 0.0},
        }
    )


def rollouts(tokenizer) -> Rollouts:
    formatter = ChatFormatter(tokenizer)
    logs = formatter.prompt_logs([r["prompt"] for r in RECORDS])
    for log, reply in zip(logs, REPLIES, strict=True):
        ids = tokenizer(reply, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        log.append({"role": "assistant", "content": reply, "token_ids": ids})
    return Rollouts(flatten_message_logs(logs, tokenizer.pad_token_id), logs, list(RECORDS))


def test_the_student_as_its_own_ema_teacher_scores_as_a_model_of_those_weights(tmp_path):
    from transformers import AutoTokenizer

    tokenizer_dir = resolve_pretrained("tiny:tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    batch = rollouts(tokenizer)
    context = PrivilegedContext(ChatFormatter(tokenizer), TEMPLATE)
    need = TeacherNeed(topk=K, sampled=True, temperature=0.9)
    student_cfg = model_config(resolve_pretrained("tiny:student"), tokenizer_dir)
    student = Policy(student_cfg, CLUSTER, executor="local")
    try:
        own = SelfTeacher(student)
        own.start(TeacherConfig(source="ema", ema_decay=0.5))
        teacher = PrivilegedTeacher(own, context, tokenizer.pad_token_id)
        assert teacher.workers() == {}  # nothing of its own to start, place or wait for
        first = teacher.score(batch, need)
        for _ in range(2):  # the loop's steps: the teacher grades, the student trains
            scores = teacher.score(batch, TeacherNeed(topk=K))
            data = dict(batch.batch)
            data["teacher_topk_logprobs"] = scores.topk_logprobs
            data["teacher_topk_indices"] = scores.topk_indices
            student.train(data, DistillationLossFn(implementation="torch"))
        moved = teacher.score(batch, need)
        student.save(str(tmp_path / "policy"))
    finally:
        student.shutdown()

    frozen_cfg = model_config(str(tmp_path / "policy" / TEACHER_DIR), tokenizer_dir)
    frozen = Policy(frozen_cfg, CLUSTER, optimizer=False, name="teacher", executor="local")
    try:
        reference = PrivilegedTeacher(InProcessTeacher(frozen), context, tokenizer.pad_token_id)
        want = reference.score(batch, need)
    finally:
        frozen.shutdown()
    assert torch.equal(moved.topk_logprobs, want.topk_logprobs)
    assert torch.equal(moved.topk_indices, want.topk_indices)
    assert torch.equal(moved.logprobs, want.logprobs)
    assert not torch.equal(moved.topk_logprobs, first.topk_logprobs)  # the average moved
    # In the student's positions: nothing inside its prompt, the reply's tokens graded.
    mask = batch.batch["token_mask"].roll(-1, dims=1).bool()
    assert moved.logprobs[mask].lt(0).all()
