"""The self-teacher's EMA on sharded students (two CPU workers, gloo): FSDP2 over data
parallel, tensor parallel with a padded vocabulary, and the Megatron engine. Scoring with the
average equals, to fp32 noise, a frozen Policy (one process, the same engine) started from the
checkpoint's teacher folder; the swap leaves the weights that refit vLLM untouched; loading the
checkpoint brings the average back after a further step has moved it, exactly."""

import pytest
import torch
from layout_runs import MEGATRON, assert_topk_close
from tiny_policies import ODD_VOCAB, VOCAB, make_batch, policy_config, start_policy

from nemo_opd.losses import DistillationLossFn
from nemo_opd.policy.engines.self_teacher_weights import TEACHER_DIR
from nemo_opd.policy.policy import Policy

# layout: (model, its vocabulary, the student's overrides, the engine's for one process)
LAYOUTS = {
    "fsdp_dp2": ("untied", VOCAB, {}, {}),
    "tp2_odd_vocab": ("odd_tied", ODD_VOCAB, {"dtensor_cfg__tensor_parallel_size": 2}, {}),
    "megatron_tp2": (
        "tied",
        VOCAB,
        {**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2},
        MEGATRON,
    ),
}
NEED = {"topk": 5, "temperature": 1.0, "logprobs": True, "hidden": True}
LOSS = DistillationLossFn(implementation="torch")
ATOL = 2e-5
"""Another layout sums in another order: fp32 noise between the sharded student and the
one-process teacher (the average and the live weights score far apart: checked)."""


def ema_student(cfg, name: str) -> Policy:
    policy = start_policy(cfg, 2, name=name)
    policy.hold_self_teacher("ema", decay=0.5)
    return policy


def assert_scores_equal(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=1e-6, msg=name)


def assert_scores_close(got: dict, want: dict, lengths: torch.Tensor) -> None:
    """Equal to fp32 noise; top-k ids up to swaps of near-ties."""
    assert got.keys() == want.keys()
    assert_topk_close(
        got["topk_logprobs"], got["topk_indices"], want["topk_logprobs"],
        want["topk_indices"].long(), lengths, ATOL,
    )  # fmt: skip
    for name in ("logprobs", "hidden_states"):
        torch.testing.assert_close(got[name], want[name], rtol=0, atol=ATOL, msg=name)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_the_average_scores_as_a_model_of_its_weights(layout, model_dirs, tmp_path):
    model, vocab, overrides, one_process = LAYOUTS[layout]
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
        live_logprobs = student.score(batch, logprobs=True)["logprobs"]
        assert (scores["logprobs"] - live_logprobs).abs().max() > 100 * ATOL
        student.save(checkpoint)
        # A further step moves the average; loading the checkpoint brings the saved one back.
        student.train(make_batch(4, k=5, vocab=vocab, seed=24), LOSS)
        moved = student.score_as_teacher(batch, **NEED)["logprobs"]
        assert (moved - scores["logprobs"]).abs().max() > 100 * ATOL
        student.load(checkpoint)
        assert_scores_equal(student.score_as_teacher(batch, **NEED), scores)
    finally:
        student.shutdown()

    frozen_cfg = policy_config(str(tmp_path / "policy" / TEACHER_DIR), **one_process)
    frozen = start_policy(frozen_cfg, 1, optimizer=False, name=f"frozen_{layout}")
    try:
        assert_scores_close(scores, frozen.score(batch, **NEED), batch["input_lengths"])
    finally:
        frozen.shutdown()
