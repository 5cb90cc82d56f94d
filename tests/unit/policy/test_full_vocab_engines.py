"""The full-vocabulary divergence through the engines on CPU workers (gloo) against a
single-process Hugging Face fp32 reference: the teacher's hidden states (get_hidden_states),
and the student's loss and training steps from them with the teacher's LM head applied inside
the chunked LM head (load_teacher_head), in DTensor and Megatron layouts with tensor and context
parallelism, packing and a padded vocabulary."""

import pytest
import torch
from references import load_reference, reference_logits, reference_train
from tiny_policies import make_batch, policy_config, start_policy

from nemo_opd.losses import TopkKLParams, build_loss_mask
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn

RAY_CPUS = 4
HIDDEN_ATOL = 2e-5
LOSS_RTOL = 1e-4
PACKING = {
    "sequence_packing__enabled": True,
    "sequence_packing__train_mb_tokens": 64,
    "sequence_packing__logprob_mb_tokens": 64,
    "sequence_packing__sequence_length_round": 1,
}
MEGATRON = {
    "dtensor_cfg__enabled": False,
    "megatron_cfg__enabled": True,
    "megatron_cfg__distributed_optimizer": False,
}
STUDENT_LAYOUTS = {
    "world1": ("", 1, {}),
    "tp2_odd_vocab": ("odd_", 2, {"dtensor_cfg__tensor_parallel_size": 2}),
    "packed_cp2": ("", 2, {"dtensor_cfg__context_parallel_size": 2, **PACKING}),
    "megatron_tp2_odd_vocab": (
        "odd_",
        2,
        {**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2},
    ),
}
TEACHER_LAYOUTS = {
    "packed_cp2": ({"dtensor_cfg__context_parallel_size": 2, **PACKING}),
    "megatron_tp2": ({**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2}),
}


def teacher_hidden(teacher_dir: str, batch: dict) -> torch.Tensor:
    """[B, S, H] the HF teacher's final hidden states (after its last norm)."""
    model = load_reference(teacher_dir)
    with torch.no_grad():
        return model.model(input_ids=batch["input_ids"]).last_hidden_state


def teacher_logits(teacher_dir: str, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return reference_logits(load_reference(teacher_dir), batch)


@pytest.mark.parametrize("layout", list(TEACHER_LAYOUTS))
def test_teacher_hidden_states_match_the_reference(layout, model_dirs, ray_session):
    """get_hidden_states against the HF reference; score's one forward pass gives what the
    separate calls give (top-k, next-token log-probs, hidden states)."""
    cfg = policy_config(model_dirs["untied"], **TEACHER_LAYOUTS[layout])
    batch = make_batch(6, teacher=False, seed=4)
    teacher = start_policy(cfg, 2, optimizer=False, name=f"teacher_{layout}")
    try:
        hidden = teacher.get_hidden_states(batch)
        values, indices = teacher.get_topk_logits(batch, 4, temperature=0.7)
        logprobs = teacher.get_logprobs(batch, temperature=0.7)
        once = teacher.score(batch, topk=4, temperature=0.7, logprobs=True, hidden=True)
    finally:
        teacher.shutdown()
    want = teacher_hidden(model_dirs["untied"], batch)
    valid = torch.arange(hidden.shape[1]) < batch["input_lengths"].unsqueeze(1)
    assert hidden.shape == want.shape
    assert (hidden[valid] - want[valid]).abs().max() < HIDDEN_ATOL
    assert hidden[~valid].eq(0).all()
    close = torch.testing.assert_close
    close(once["hidden_states"], hidden, rtol=0, atol=1e-6)
    close(once["topk_logprobs"], values, rtol=0, atol=1e-6)
    assert once["topk_indices"].dtype == torch.int32 and once["topk_indices"].eq(indices).all()
    close(once["logprobs"], logprobs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("support", ["full", "student_topk"])
@pytest.mark.parametrize("layout", list(STUDENT_LAYOUTS))
def test_student_loss_and_steps_match_the_reference(layout, support, model_dirs, ray_session):
    prefix, workers, overrides = STUDENT_LAYOUTS[layout]
    student_dir, teacher_dir = model_dirs[f"{prefix}tied"], model_dirs[f"{prefix}untied"]
    reference = load_reference(student_dir)
    batch = make_batch(8, teacher=False, seed=5, vocab=reference.config.vocab_size)
    batch["sample_mask"][3] = 0.0
    batch["teacher_hidden"] = teacher_hidden(teacher_dir, batch)
    params = TopkKLParams(kl_type="mixed", temperature=0.9)
    loss_fn = FullVocabDistillationLossFn(
        params=params, support=support, k=5, teacher_temperature=1.2, implementation="torch"
    )
    cfg = policy_config(student_dir, **overrides)
    student = start_policy(cfg, workers, name=f"student_{layout}_{support}")
    try:
        student.load_teacher_head(teacher_dir, "float32")
        evaluated = student.evaluate(batch, loss_fn)
        metrics = student.train(batch, loss_fn)
    finally:
        student.shutdown()

    reference_batch = {k: v for k, v in batch.items() if k != "teacher_hidden"}
    reference_batch["teacher_logits"] = teacher_logits(teacher_dir, batch)
    with torch.no_grad():
        count = build_loss_mask(batch["token_mask"], batch["sample_mask"]).sum()
        want, want_metrics = loss_fn(reference_logits(reference, batch), reference_batch, count)
    close = torch.testing.assert_close
    close(torch.tensor(evaluated["loss"]), want.float(), rtol=LOSS_RTOL, atol=0.0)
    close(
        torch.tensor(evaluated["forward_kl"]),
        want_metrics["forward_kl"].float(),
        rtol=LOSS_RTOL,
        atol=0.0,
    )
    losses, norms, _, _ = reference_train(
        reference, reference_batch, loss_fn, cfg, cfg.train_global_batch_size
    )
    close(torch.tensor(metrics["loss"]), torch.tensor(losses), rtol=LOSS_RTOL, atol=0.0)
    close(torch.tensor(metrics["grad_norm"]), torch.tensor(norms), rtol=1e-3, atol=0.0)


def test_teacher_head_of_another_vocabulary_is_refused(model_dirs):
    cfg = policy_config(model_dirs["tied"])
    student = start_policy(cfg, 1, name="student_vocab_mismatch")
    try:
        with pytest.raises(Exception, match="one vocabulary"):
            student.load_teacher_head(model_dirs["odd_untied"], "float32")
    finally:
        student.shutdown()
