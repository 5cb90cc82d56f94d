"""The full-vocabulary divergence through the engines on CPU workers (gloo) against a
single-process Hugging Face fp32 reference: the teacher's hidden states (get_hidden_states) and
top-k, and the student's loss and training steps from them with the teacher's LM head applied
inside the chunked LM head (load_teacher_head), in DTensor and Megatron layouts with tensor and
context parallelism, packing and a padded vocabulary. Each student layout is one Policy that
evaluates both supports (full, student_topk) and then trains two steps with each in turn, as
one process of Hugging Face does."""

import pytest
import torch
from layout_runs import MEGATRON, assert_topk_close
from references import load_reference, reference_logits, reference_topk, reference_train
from tiny_policies import make_batch, policy_config, start_policy

from nemo_opd.losses import TopkKLParams, build_loss_mask
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn

HIDDEN_ATOL = 2e-5
LOSS_RTOL = 1e-4
PACKING = {
    "sequence_packing__enabled": True,
    "sequence_packing__train_mb_tokens": 64,
    "sequence_packing__logprob_mb_tokens": 64,
    "sequence_packing__sequence_length_round": 1,
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
    "packed_cp2": ("untied", {"dtensor_cfg__context_parallel_size": 2, **PACKING}),
    # the vocabulary padded to 512 inside the engine: every id it returns must be a real one
    "megatron_tp2_odd_vocab": (
        "odd_untied",
        {**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2},
    ),
}
SUPPORTS = ("full", "student_topk")


def teacher_hidden(teacher_dir: str, batch: dict) -> torch.Tensor:
    """[B, S, H] the HF teacher's final hidden states (after its last norm)."""
    model = load_reference(teacher_dir)
    with torch.no_grad():
        return model.model(input_ids=batch["input_ids"]).last_hidden_state


def labelled(*label: str):
    """assert_close's message with `label` in front of it."""
    return lambda message: f"{' '.join(label)}: {message}"


def teacher_logits(teacher_dir: str, batch: dict) -> torch.Tensor:
    with torch.no_grad():
        return reference_logits(load_reference(teacher_dir), batch)


@pytest.mark.parametrize("layout", list(TEACHER_LAYOUTS))
def test_teacher_hidden_states_match_the_reference(layout, model_dirs):
    """get_hidden_states against the HF reference, and get_topk_logits (ids up to swaps of
    near-ties, every one a real id); score's one forward pass gives what the separate calls
    give (top-k, next-token log-probs, hidden states)."""
    kind, overrides = TEACHER_LAYOUTS[layout]
    reference = load_reference(model_dirs[kind])
    vocab = reference.config.vocab_size
    cfg = policy_config(model_dirs[kind], **overrides)
    batch = make_batch(6, teacher=False, seed=4, vocab=vocab)
    teacher = start_policy(cfg, 2, optimizer=False, name=f"teacher_{layout}")
    try:
        hidden = teacher.get_hidden_states(batch)
        values, indices = teacher.get_topk_logits(batch, 4, temperature=0.7)
        logprobs = teacher.get_logprobs(batch, temperature=0.7)
        once = teacher.score(batch, topk=4, temperature=0.7, logprobs=True, hidden=True)
    finally:
        teacher.shutdown()
    want = teacher_hidden(model_dirs[kind], batch)
    valid = torch.arange(hidden.shape[1]) < batch["input_lengths"].unsqueeze(1)
    assert hidden.shape == want.shape
    assert (hidden[valid] - want[valid]).abs().max() < HIDDEN_ATOL
    assert hidden[~valid].eq(0).all()
    assert int(indices.max()) < vocab
    ref_values, ref_indices = reference_topk(reference, batch, 4, temperature=0.7)
    lengths = batch["input_lengths"]
    assert_topk_close(values, indices, ref_values, ref_indices, lengths, HIDDEN_ATOL)
    close = torch.testing.assert_close
    close(once["hidden_states"], hidden, rtol=0, atol=1e-6)
    close(once["topk_logprobs"], values, rtol=0, atol=1e-6)
    assert once["topk_indices"].dtype == torch.int32 and once["topk_indices"].eq(indices).all()
    close(once["logprobs"], logprobs, rtol=0, atol=1e-6)


@pytest.mark.parametrize("layout", list(STUDENT_LAYOUTS))
def test_student_loss_and_steps_match_the_reference(layout, model_dirs):
    prefix, workers, overrides = STUDENT_LAYOUTS[layout]
    student_dir, teacher_dir = model_dirs[f"{prefix}tied"], model_dirs[f"{prefix}untied"]
    reference = load_reference(student_dir)
    batch = make_batch(8, teacher=False, seed=5, vocab=reference.config.vocab_size)
    batch["sample_mask"][3] = 0.0
    batch["teacher_hidden"] = teacher_hidden(teacher_dir, batch)
    params = TopkKLParams(kl_type="mixed", temperature=0.9)
    loss_fns = {
        support: FullVocabDistillationLossFn(
            params=params, support=support, k=5, teacher_temperature=1.2, implementation="torch"
        )
        for support in SUPPORTS
    }
    cfg = policy_config(student_dir, **overrides)
    student = start_policy(cfg, workers, name=f"student_{layout}")
    try:
        student.load_teacher_head(teacher_dir, "float32")
        evaluated = {support: student.evaluate(batch, fn) for support, fn in loss_fns.items()}
        trained = {support: student.train(batch, fn) for support, fn in loss_fns.items()}
    finally:
        student.shutdown()

    reference_batch = {k: v for k, v in batch.items() if k != "teacher_hidden"}
    reference_batch["teacher_logits"] = teacher_logits(teacher_dir, batch)
    count = build_loss_mask(batch["token_mask"], batch["sample_mask"]).sum()
    close = torch.testing.assert_close
    for support, loss_fn in loss_fns.items():
        with torch.no_grad():
            want, want_metrics = loss_fn(reference_logits(reference, batch), reference_batch, count)
        for name, value in (("loss", want), ("forward_kl", want_metrics["forward_kl"])):
            got = torch.tensor(evaluated[support][name])
            close(got, value.float(), rtol=LOSS_RTOL, atol=0.0, msg=labelled(support, name))
    optimizer = None  # the second support's steps continue from the first's
    for support, loss_fn in loss_fns.items():
        losses, norms, _, optimizer = reference_train(
            reference, reference_batch, loss_fn, cfg, cfg.train_global_batch_size, optimizer
        )
        metrics = trained[support]
        for name, want, rtol in (("loss", losses, LOSS_RTOL), ("grad_norm", norms, 1e-3)):
            got = torch.tensor(metrics[name])
            close(got, torch.tensor(want), rtol=rtol, atol=0.0, msg=labelled(support, name))


def test_teacher_head_of_another_vocabulary_is_refused(model_dirs):
    cfg = policy_config(model_dirs["tied"])
    student = start_policy(cfg, 1, name="student_vocab_mismatch")
    try:
        with pytest.raises(Exception, match="one vocabulary"):
            student.load_teacher_head(model_dirs["odd_untied"], "float32")
    finally:
        student.shutdown()
