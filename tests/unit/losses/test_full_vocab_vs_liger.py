"""The full-vocabulary JSD (loss_fn.support full), on the student's chunked path, against a peer's
own: Liger-Kernel's chunked distillation loss (LigerFusedLinearJSDLoss, run eagerly on the CPU)
computes the same generalized JSD from the same hidden states and LM heads, with its own
convention (beta weighs the teacher's side, m = beta p + (1 - beta) q) and its own chunking.
The losses and the gradients of the student's hidden states and head must agree in float32."""

import pytest
import torch
import torch.nn.functional as F

from nemo_opd.losses.chunked_head import chunked_head_loss
from nemo_opd.losses.divergence import TopkKLParams
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.losses.teacher_logits import TeacherLogits

liger = pytest.importorskip("liger_kernel.chunked_loss")


def case(tokens=48, hidden=16, vocab=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [
        torch.randn(tokens, hidden, generator=gen),
        torch.randn(vocab, hidden, generator=gen) * 0.5,
        torch.randn(tokens, hidden, generator=gen),
        torch.randn(vocab, hidden, generator=gen) * 0.8,  # a more peaked teacher
    ]


def ours(si, sw, ti, tw, beta, temperature, chunk):
    params = TopkKLParams(kl_type="jsd", jsd_beta=beta, temperature=temperature)
    loss_fn = FullVocabDistillationLossFn(params=params)
    count = float(si.shape[0])

    def chunk_loss(logits, part):
        teacher = TeacherLogits.from_hidden(
            part["teacher_hidden"], lambda rows: F.linear(rows, tw), tw.shape[0]
        )
        return loss_fn(logits, {"loss_mask": part["loss_mask"], "teacher_logits": teacher}, count)

    fields = {"loss_mask": torch.ones(1, si.shape[0]), "teacher_hidden": ti.unsqueeze(0)}
    return chunked_head_loss(si.unsqueeze(0), sw, fields, chunk_loss, chunk=chunk)[0]


def theirs(si, sw, ti, tw, beta, temperature):
    module = liger.LigerFusedLinearJSDLoss(
        weight_hard_loss=0.0,
        weight_soft_loss=1.0,
        beta=beta,
        temperature=temperature,
        compiled=False,
        chunk_size=16,
    )
    return module(si, sw, ti, tw, torch.zeros(si.shape[0], dtype=torch.long))


def loss_and_grads(loss_fn, inputs):
    leaves = [t.clone().requires_grad_(i < 2) for i, t in enumerate(inputs)]
    loss = loss_fn(*leaves)
    loss.backward()
    return loss.detach(), leaves[0].grad, leaves[1].grad


@pytest.mark.parametrize("temperature", [1.0, 2.0])
@pytest.mark.parametrize("beta", [0.1, 0.5, 0.9])
def test_the_jsd_and_its_gradients_are_liger_kernels(beta, temperature):
    inputs = case()
    mine = loss_and_grads(lambda *t: ours(*t, beta, temperature, chunk=20), inputs)
    peer = loss_and_grads(lambda *t: theirs(*t, beta, temperature), inputs)
    assert mine[0] > 1e-3  # a divergence worth comparing
    for got, want in zip(mine, peer, strict=True):
        torch.testing.assert_close(got, want, rtol=2e-5, atol=1e-7)
