"""The self-teacher's EMA on sharded students (two CPU workers, gloo): FSDP2 over data
parallel, tensor parallel with a padded vocabulary, and the Megatron engine. Scoring with the
average equals a frozen Policy of the same layout started from the checkpoint's teacher folder;
the swap leaves the weights that refit vLLM untouched; a resumed Policy scores the same."""

import pytest
import torch
from tiny_policies import ODD_VOCAB, VOCAB, cpu_cluster, make_batch, policy_config

from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.engines.self_teacher_weights import TEACHER_DIR
from nemo_opd.policy.policy import Policy

MEGATRON = {
    "dtensor_cfg__enabled": False,
    "megatron_cfg__enabled": True,
    "megatron_cfg__distributed_optimizer": False,
}
LAYOUTS = {
    "fsdp_dp2": ("untied", VOCAB, {}),
    "tp2_odd_vocab": ("odd_tied", ODD_VOCAB, {"dtensor_cfg__tensor_parallel_size": 2}),
    "megatron_tp2": ("tied", VOCAB, {**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2}),
}
NEED = {"topk": 5, "temperature": 1.0, "logprobs": True, "hidden": True}
LOSS = DistillationLossFn(implementation="torch")


def ema_student(cfg, name: str) -> Policy:
    policy = Policy(cfg, cpu_cluster(2), name=name)
    policy.hold_self_teacher("ema", decay=0.5)
    return policy


def assert_scores_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_average_scores_as_a_model_of_its_weights(layout, model_dirs, ray_session, tmp_path):
    model, vocab, overrides = LAYOUTS[layout]
    cfg = policy_config(model_dirs[model], optimizer={"lr": 3e-2}, **overrides)
    batch = make_batch(4, k=5, vocab=vocab, seed=21)
    checkpoint = str(tmp_path / "policy")
    student = ema_student(cfg, f"student_{layout}")
    try:
        for seed in (22, 23):
            student.train(make_batch(4, k=5, vocab=vocab, seed=seed), LOSS)
        live = student.full_weights()
        scores = student.score_as_teacher(batch, **NEED)
        for name, weight in student.full_weights().items():  # what refits vLLM: the live ones
            assert torch.equal(weight, live[name]), name
        assert not torch.equal(scores["logprobs"], student.score(batch, logprobs=True)["logprobs"])
        student.save(checkpoint)
    finally:
        student.shutdown()

    frozen_cfg = policy_config(str(tmp_path / "policy" / TEACHER_DIR), **overrides)
    frozen = Policy(frozen_cfg, cpu_cluster(2), optimizer=False, name=f"frozen_{layout}")
    try:
        assert_scores_equal(scores, frozen.score(batch, **NEED))
    finally:
        frozen.shutdown()
    resumed = ema_student(cfg, f"resumed_{layout}")
    try:
        resumed.load(checkpoint)
        assert_scores_equal(resumed.score_as_teacher(batch, **NEED), scores)
    finally:
        resumed.shutdown()
