"""The chunked LM head (policy.logits_chunk_tokens) against the whole logits (null), on the
same model and batch, in the layouts whose code paths differ: one process, vocab-parallel TP
(with a padded vocabulary), context parallel, packing over data parallel, TP x CP, and the
Megatron engine under TP. Compared
to fp32 noise: the teacher's top-k values and ids and the log-probs, the losses and gradient
norms of two top-k steps and two policy-gradient steps (with the top-k term), and the weights
after them, the LM head's among them. (test_policy_parallel compares the chunked path with the
Hugging Face reference in every layout.)"""

import pytest
import torch
from test_megatron_engine import MEGATRON
from test_policy_parallel import LAYOUTS, policy_gradient_case
from tiny_policies import ODD_VOCAB, VOCAB, make_batch, policy_config, start_policy

from nemo_opd.losses import DistillationLossFn, TopkKLParams, build_loss_mask

RAY_CPUS = 4
K = 4
COMPARED = {
    **{name: LAYOUTS[name] for name in ("world1", "tp2_odd_vocab", "cp2", "packed_dp2")},
    "tp2_cp2_odd_vocab": LAYOUTS["tp2_cp2_odd_vocab"],
    # the Megatron engine's output layer, tied to the embedding and split over tp
    "megatron_tp2_odd_vocab": (
        "odd_tied",
        2,
        {**MEGATRON, "megatron_cfg__tensor_model_parallel_size": 2},
    ),
}


def run(cfg, workers: int, name: str, vocab: int) -> dict:
    """What a Policy computes on the test batch: top-k, log-probs, two top-k steps, two
    policy-gradient steps, the weights."""
    batch = make_batch(8, k=K, seed=3, vocab=vocab)
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")
    policy = start_policy(cfg, workers, name=name)
    try:
        values, indices = policy.get_topk_logits(batch, K)
        logprobs = policy.get_logprobs(batch, temperature=0.9)
        trained = policy.score(batch, topk=K, temperature=0.9, logprobs=True, trained_only=True)
        at_09 = policy.get_topk_logits(batch, K, temperature=0.9)
        topk_steps = policy.train(batch, loss_fn)
        pg_batch, pg_loss = policy_gradient_case(batch, logprobs)
        pg_steps = policy.train(pg_batch, pg_loss)
        weights = policy.full_weights()
    finally:
        policy.shutdown()
    return {
        "values": values,
        "indices": indices,
        "logprobs": logprobs,
        "trained": trained,
        "at_09": at_09,
        "topk_steps": topk_steps,
        "pg_steps": pg_steps,
        "weights": weights,
    }


@pytest.mark.parametrize("layout", list(COMPARED))
def test_chunked_equals_the_whole_logits(layout, model_dirs, ray_session):
    kind, workers, overrides = COMPARED[layout]
    vocab = ODD_VOCAB if kind.startswith("odd") else VOCAB
    chunked_cfg = policy_config(model_dirs[kind], **overrides)
    chunked = run(chunked_cfg, workers, f"chunked_{layout}", vocab)
    whole = policy_config(model_dirs[kind], logits_chunk_tokens=None, **overrides)
    reference = run(whole, workers, f"whole_{layout}", vocab)
    close = {"rtol": 1e-5, "atol": 1e-6}
    torch.testing.assert_close(chunked["values"], reference["values"], **close)
    assert torch.equal(chunked["indices"], reference["indices"])
    torch.testing.assert_close(chunked["logprobs"], reference["logprobs"], **close)
    for result in (chunked, reference):
        assert_trained_only_scores(result, make_batch(8, k=K, seed=3, vocab=vocab))
    for steps in ("topk_steps", "pg_steps"):
        for metric in ("loss", "grad_norm"):
            got = torch.tensor(chunked[steps][metric])
            torch.testing.assert_close(got, torch.tensor(reference[steps][metric]), **close)
    assert chunked["weights"].keys() == reference["weights"].keys()
    for name, weight in chunked["weights"].items():
        # AdamW's first steps move every element by about lr: noise in a gradient's last bits
        # can move one by a fraction of that, a wrong gradient by all of it.
        torch.testing.assert_close(weight, reference["weights"][name], rtol=0, atol=1e-5)


def assert_trained_only_scores(result: dict, batch: dict) -> None:
    """score(trained_only=True) is score's top-k and log-probs where the next token is trained
    (token_mask[t + 1]) and 0 elsewhere."""
    scored = build_loss_mask(batch["token_mask"]) != 0
    assert 0 < scored.sum() < (batch["input_ids"] != 0).sum()  # prompts are left out
    values, indices = result["at_09"]
    trained = result["trained"]
    close = {"rtol": 1e-5, "atol": 1e-6}  # the head's product over fewer rows: fp32 noise
    torch.testing.assert_close(trained["topk_logprobs"], values * scored.unsqueeze(-1), **close)
    assert torch.equal(trained["topk_indices"], indices * scored.unsqueeze(-1))
    torch.testing.assert_close(trained["logprobs"], result["logprobs"] * scored, **close)
