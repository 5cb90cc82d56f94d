"""Every output-head family through the DTensor engine (one float32 process, gloo, no Ray)
against Hugging Face's own forward of the same saved model (eager attention, fp32):

- the student's and teacher's scoring: get_logprobs, get_topk_logits and score (the teacher's
  one-pass top-k and log-probs), chunked (policy.logits_chunk_tokens) and whole;
- the student's training through the chunked head: the loss, the gradient norm and the weights
  after the steps (the LM head's bias included where the family has one);
- the teacher's LM head held by the student under loss_fn.support full: the teacher's logits
  and the student's full-vocabulary loss from the teacher's hidden states.

The families' tiny models come from tests/model_families.py; their heads' steps (scale,
soft-cap, bias) are made large enough that leaving one out fails every comparison here."""

import pytest
import torch
from model_families import FAMILIES, NOT_PLAIN, VOCAB, save_family_model
from references import load_reference, reference_logits, reference_train
from tiny_policies import make_batch, policy_config

from nemo_opd.data.batching import TensorBatch
from nemo_opd.losses import DistillationLossFn, TopkKLParams, build_loss_mask
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.policy.engines.dtensor import DTensorEngine

CHUNK = 7
TEMPERATURE = 0.8
K = 4
ATOL = 2e-5
CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    """{model_type: folder} of every family's tiny random model."""
    root = tmp_path_factory.mktemp("families")
    return {name: save_family_model(name, root / name, seed=7) for name in FAMILIES}


def valid_positions(batch: dict, next_token: bool) -> torch.Tensor:
    """[B, S] bool: positions inside a row (with next_token: that have a next token)."""
    lengths = batch["input_lengths"].unsqueeze(1) - (1 if next_token else 0)
    return torch.arange(batch["input_ids"].shape[1]) < lengths


def check_scores(lp, values, ids, want_logp, batch) -> None:
    """Next-token log-probs and top-k against the reference's log-probs [B, S, V]."""
    targets = torch.roll(batch["input_ids"], -1, dims=1)
    want_lp = want_logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    real = valid_positions(batch, next_token=True)
    torch.testing.assert_close(lp[real], want_lp[real], rtol=0, atol=ATOL)
    inside = valid_positions(batch, next_token=False)
    want_values = want_logp.topk(K, dim=-1).values
    torch.testing.assert_close(values[inside], want_values[inside], rtol=0, atol=ATOL)
    # The ids are the reference's own top-k up to ties: its log-probs at them are the values.
    at_ids = want_logp.gather(-1, ids.long())
    torch.testing.assert_close(at_ids[inside], values[inside], rtol=0, atol=ATOL)


@pytest.mark.parametrize("chunk", [CHUNK, None], ids=["chunked", "whole"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_scores_match_the_family_forward(world1, family_dirs, family, chunk):
    batch = make_batch(5, teacher=False, seed=3, vocab=VOCAB)
    reference = load_reference(family_dirs[family])
    with torch.no_grad():
        want = torch.log_softmax(reference_logits(reference, batch) / TEMPERATURE, dim=-1)
    cfg = policy_config(family_dirs[family], logits_chunk_tokens=chunk)
    engine = DTensorEngine(cfg, world1, CPU, with_optimizer=False)
    lp = engine.get_logprobs(TensorBatch(batch), temperature=TEMPERATURE)
    values, ids = engine.get_topk_logits(TensorBatch(batch), K, temperature=TEMPERATURE)
    check_scores(lp, values, ids, want, batch)
    once = engine.score(TensorBatch(batch), topk=K, temperature=TEMPERATURE, logprobs=True)
    check_scores(once["logprobs"], once["topk_logprobs"], once["topk_indices"], want, batch)


@pytest.mark.parametrize("family", ["qwen3", *NOT_PLAIN])
def test_chunked_training_matches_the_family_forward(world1, family_dirs, family):
    """Two optimizer steps through the chunked head against autograd through Hugging Face's
    forward: losses, gradient norms, and every weight after the steps."""
    batch = make_batch(8, seed=4, vocab=VOCAB)
    batch["sample_mask"][2] = 0.0
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed", temperature=0.9))
    cfg = policy_config(family_dirs[family], train_micro_batch_size=2)
    engine = DTensorEngine(cfg, world1, CPU, total_steps=10)
    metrics = engine.train(TensorBatch(batch), loss_fn, global_batch_size=4)
    weights = engine.gather_weights()

    reference = load_reference(family_dirs[family])
    losses, norms, params, _ = reference_train(reference, batch, loss_fn, cfg, 4)
    close = torch.testing.assert_close
    close(torch.tensor(metrics["loss"]), torch.tensor(losses), rtol=1e-4, atol=0.0)
    close(torch.tensor(metrics["grad_norm"]), torch.tensor(norms), rtol=1e-4, atol=0.0)
    if family == "phi":
        assert "lm_head.bias" in weights and weights["lm_head.bias"].shape == (VOCAB,)
    for name, weight in weights.items():
        close(weight, params[name].detach(), rtol=1e-4, atol=1e-5, msg=name)


@pytest.fixture(scope="module")
def student(world1, family_dirs):
    """A frozen tiny Qwen3 student of the families' vocabulary, chunked head."""
    cfg = policy_config(family_dirs["qwen3"])
    return DTensorEngine(cfg, world1, CPU, with_optimizer=False)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_teacher_head_matches_the_family_forward(student, family_dirs, family):
    """The teacher's logits from its hidden states (load_teacher_head), and the student's
    full-vocabulary divergence from them, against the teacher's Hugging Face logits."""
    batch = make_batch(6, teacher=False, seed=5, vocab=VOCAB)
    teacher = load_reference(family_dirs[family])
    with torch.no_grad():
        hidden = teacher.get_decoder()(input_ids=batch["input_ids"]).last_hidden_state
        want = reference_logits(teacher, batch)
    student.load_teacher_head(family_dirs[family], "float32")
    logits = student.teacher_head.logits(hidden)
    torch.testing.assert_close(logits[..., :VOCAB], want, rtol=0, atol=ATOL)

    batch["teacher_hidden"] = hidden
    loss_fn = FullVocabDistillationLossFn(
        params=TopkKLParams(kl_type="mixed", temperature=0.9), teacher_temperature=1.2
    )
    evaluated = student.evaluate(TensorBatch(batch), loss_fn)
    reference_batch = {k: v for k, v in batch.items() if k != "teacher_hidden"}
    reference_batch["teacher_logits"] = want
    count = build_loss_mask(batch["token_mask"], batch["sample_mask"]).sum()
    with torch.no_grad():
        student_logits = reference_logits(load_reference(family_dirs["qwen3"]), batch)
        loss, _ = loss_fn(student_logits, reference_batch, count)
    torch.testing.assert_close(torch.tensor(evaluated["loss"]), loss, rtol=1e-5, atol=0.0)
