"""chunked_head_loss: the LM head and the loss over chunks of positions equal the unchunked
loss of the whole logits, and their gradients with respect to the hidden states and the LM-head
weight, for every objective's loss (the top-k divergence of every kl_type, both tails and a
temperature; the policy gradient with and without its top-k term; the NLL), with chunks that do
not divide the positions, a padded vocabulary, and masked positions. The unchunked reference is
float64, autograd through F.linear (or through a model's head: its bias, scale or soft-cap,
nemo_opd/models/output_head.py). Under no_grad (evaluation) it runs no backward and forms
no weight gradient, with the same loss and metrics."""

import pytest
import torch
from topk_kl_testing import make_case

from nemo_opd.losses import (
    DistillationLossFn,
    NLLLossFn,
    PolicyGradientLossFn,
    TopkKLParams,
)
from nemo_opd.losses.chunked_head import chunked_head_loss, chunked_scores
from nemo_opd.models.output_head import OutputHead

B, S, H, V, V_PAD, K = 3, 11, 16, 37, 40, 5


def mask(logits: torch.Tensor) -> torch.Tensor:
    """The padding columns (ids >= V) at -inf, as the engines mask them."""
    return logits.masked_fill(torch.arange(logits.shape[-1]) >= V, float("-inf"))


def head(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return mask(torch.nn.functional.linear(hidden, weight))


def inputs(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, dict]:
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, S, H, generator=gen)
    weight = torch.randn(V_PAD, H, generator=gen) * 0.5
    _, logprobs, ids = make_case(B * S, V, K, seed=seed + 1)
    loss_mask = (torch.rand(B, S, generator=gen) > 0.3).float()
    loss_mask[2, :4] = 0.0
    targets = torch.randint(0, V, (B, S), generator=gen)
    with torch.no_grad():
        logp = torch.log_softmax(head(hidden, weight), -1).gather(-1, targets[..., None])[..., 0]
    fields = {
        "loss_mask": loss_mask,
        "teacher_topk_logprobs": logprobs.view(B, S, K),
        "teacher_topk_indices": ids.view(B, S, K),
        "targets": targets,
        "old_logprobs": logp + 0.3 * torch.randn(B, S, generator=gen),
        "sampler_logprobs": logp + 0.2 * torch.randn(B, S, generator=gen),
        "advantages": torch.randn(B, S, generator=gen),
    }
    return hidden, weight, fields


LOSSES = {
    **{
        f"topk_{kl}_{tail}": lambda kl=kl, tail=tail: DistillationLossFn(
            params=TopkKLParams(kl_type=kl, tail=tail, temperature=0.8), implementation="torch"
        )
        for kl in ("forward", "reverse", "mixed", "jsd")
        for tail in ("bucket", "renormalize")
    },
    "policy_gradient": lambda: PolicyGradientLossFn(clip_eps_high=0.28, temperature=0.9),
    "policy_gradient_with_topk": lambda: PolicyGradientLossFn(
        topk_kl=DistillationLossFn(implementation="torch"), topk_kl_coef=0.3
    ),
    "nll": lambda: NLLLossFn(temperature=0.7),
}


def unchunked(loss_fn, hidden, weight, fields, count):
    """float64 loss, metrics and gradients of the whole logits (autograd through F.linear)."""
    h = hidden.double().requires_grad_()
    w = weight.double().requires_grad_()
    double = {k: v.double() if v.is_floating_point() else v for k, v in fields.items()}
    loss, metrics = loss_fn(head(h, w), double, count)
    loss.backward()
    return loss.detach(), metrics, h.grad, w.grad


@pytest.mark.parametrize("chunk", [1, 4, 7, 1000])
@pytest.mark.parametrize("name", list(LOSSES))
def test_chunked_equals_the_whole_logits(name, chunk):
    loss_fn = LOSSES[name]()
    hidden, weight, fields = inputs()
    count = fields["loss_mask"].sum()
    ref_loss, ref_metrics, ref_dh, ref_dw = unchunked(loss_fn, hidden, weight, fields, count)

    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()

    def loss_of_logits(logits, part):
        return loss_fn(logits, part, count)

    loss, metrics = chunked_head_loss(h, w, fields, loss_of_logits, chunk=chunk, finish=mask)
    (loss * 0.7).backward()  # backward scales the gradients stored in forward
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h.grad.double(), 0.7 * ref_dh.double(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), 0.7 * ref_dw.double(), rtol=1e-4, atol=1e-6)
    assert set(metrics) == set(ref_metrics)
    for key, value in metrics.items():
        torch.testing.assert_close(value.double(), ref_metrics[key].double(), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("chunk", [1, 4, 1000])
@pytest.mark.parametrize("name", list(LOSSES))
def test_the_head_on_the_loss_masks_positions_only_equals_the_whole_logits(name, chunk):
    """keep = the loss mask: the head runs on the kept positions only, and the loss, both
    gradients and every metric still equal the float64 reference of the whole logits."""
    loss_fn = LOSSES[name]()
    hidden, weight, fields = inputs(seed=7)
    count = fields["loss_mask"].sum()
    ref_loss, ref_metrics, ref_dh, ref_dw = unchunked(loss_fn, hidden, weight, fields, count)
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    projected = []

    def project(rows, weight, bias):
        projected.append(rows.shape[0])
        return torch.nn.functional.linear(rows, weight, bias)

    loss, metrics = chunked_head_loss(
        h, w, fields, lambda z, part: loss_fn(z, part, count), chunk=chunk, project=project,
        finish=mask, keep=fields["loss_mask"] != 0,
    )  # fmt: skip
    loss.backward()
    assert sum(projected) == int((fields["loss_mask"] != 0).sum()) < B * S
    torch.testing.assert_close(loss.double(), ref_loss.double(), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h.grad.double(), ref_dh.double(), rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(w.grad.double(), ref_dw.double(), rtol=1e-4, atol=1e-6)
    assert set(metrics) == set(ref_metrics)
    for key, value in metrics.items():
        torch.testing.assert_close(value.double(), ref_metrics[key].double(), rtol=1e-4, atol=1e-6)


HEADS = {
    "biased": OutputHead(biased=True),
    "divided": OutputHead(divide_by=8.0),
    "multiplied": OutputHead(multiply_by=0.25),
    "softcapped": OutputHead(softcap=2.0),
    "biased_softcapped": OutputHead(biased=True, softcap=2.0),
}
"""Model heads beyond the plain product (nemo_opd/models/output_head.py)."""


@pytest.mark.parametrize("chunk", [4, 1000])
@pytest.mark.parametrize("head_name", list(HEADS))
@pytest.mark.parametrize("name", ["topk_reverse_bucket", "policy_gradient_with_topk", "nll"])
def test_a_model_head_equals_its_whole_logits(name, head_name, chunk):
    """A head with a bias and a scale or soft-cap: the product and its gradients by hand, the
    head's transform by autograd (finish), equal the float64 reference that differentiates the
    whole head's logits, the bias's gradient included; keep = the loss mask."""
    loss_fn, model_head = LOSSES[name](), HEADS[head_name]
    hidden, weight, fields = inputs(seed=11)
    weight = weight * 6.0  # logits large enough for the soft-cap and the scales to matter
    bias = torch.randn(V_PAD, generator=torch.Generator().manual_seed(12)) * 2.0
    bias = bias if model_head.biased else None
    count = fields["loss_mask"].sum()
    h64, w64 = hidden.double().requires_grad_(), weight.double().requires_grad_()
    b64 = bias.double().requires_grad_() if bias is not None else None
    double = {k: v.double() if v.is_floating_point() else v for k, v in fields.items()}
    ref_loss, _ = loss_fn(mask(model_head.logits(h64, w64, b64)), double, count)
    ref_loss.backward()

    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    b = bias.clone().requires_grad_() if bias is not None else None
    loss, _ = chunked_head_loss(
        h, w, fields, lambda z, part: loss_fn(z, part, count), chunk=chunk,
        project=model_head.project, finish=lambda raw: mask(model_head.transform(raw)), bias=b,
        keep=fields["loss_mask"] != 0,
    )  # fmt: skip
    loss.backward()
    close = torch.testing.assert_close
    close(loss.double(), ref_loss.detach().double(), rtol=1e-5, atol=1e-7)
    close(h.grad.double(), h64.grad, rtol=1e-4, atol=1e-6)
    close(w.grad.double(), w64.grad, rtol=1e-4, atol=1e-6)
    if bias is not None:
        close(b.grad.double(), b64.grad, rtol=1e-4, atol=1e-6)
    plain, _ = loss_fn(head(hidden, weight), fields, count)
    assert (plain - loss).abs() > 1e-3  # the head's step changes the loss


def test_with_nothing_kept_one_position_keeps_the_metrics_names():
    """A dummy microbatch (an empty loss mask) still reports every metric, with a zero loss
    and zero gradients: every rank reduces the same names."""
    loss_fn = LOSSES["topk_forward_bucket"]()
    hidden, weight, fields = inputs(seed=9)
    fields["loss_mask"] = torch.zeros(B, S)
    h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
    _, ref_metrics = loss_fn(head(hidden, weight), fields, 1)
    loss, metrics = chunked_head_loss(
        h, w, fields, lambda z, part: loss_fn(z, part, 1), chunk=4, finish=mask,
        keep=fields["loss_mask"] != 0,
    )  # fmt: skip
    loss.backward()
    assert float(loss) == 0.0 and set(metrics) == set(ref_metrics)
    assert not h.grad.any() and not w.grad.any()


def test_without_gradients_only_the_loss():
    loss_fn = LOSSES["topk_forward_bucket"]()
    hidden, weight, fields = inputs(seed=3)
    count = fields["loss_mask"].sum()
    with torch.no_grad():
        whole, _ = loss_fn(head(hidden, weight), fields, count)
        loss, _ = chunked_head_loss(
            hidden, weight, fields, lambda z, p: loss_fn(z, p, count), chunk=4, finish=mask
        )
    torch.testing.assert_close(loss, whole, rtol=1e-5, atol=1e-7)


def test_scores_visit_every_position_once_in_order():
    hidden, weight, _ = inputs(seed=5)
    whole = head(hidden.reshape(-1, H), weight).topk(K, -1).values
    seen = torch.full_like(whole, float("nan"))

    def keep_topk(logits, start, end):
        seen[start:end] = logits.topk(K, -1).values

    chunked_scores(hidden, weight, keep_topk, chunk=7, finish=mask)
    torch.testing.assert_close(seen, whole)


def test_under_no_grad_no_backward_and_no_weight_gradient():
    # Evaluation runs under no_grad, where the LM head's weight still requires grad (it is a
    # parameter): the chunked loss must not differentiate the chunks nor build dL/dW then.
    # A vocabulary and width whose fp32 [V, H] size no other buffer here shares.
    vocab, width = 1009, 24
    loss_fn = LOSSES["topk_forward_bucket"]()
    _, _, fields = inputs(seed=7)
    hidden = torch.randn(B, S, width, generator=torch.Generator().manual_seed(7))
    weight = torch.nn.Parameter(torch.randn(vocab, width) * 0.1)
    fields = {**fields, "teacher_topk_indices": fields["teacher_topk_indices"] % vocab}
    count = fields["loss_mask"].sum()
    seen = []

    def loss_of_logits(logits, part):
        seen.append(logits.requires_grad)
        return loss_fn(logits, part, count)

    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.no_grad(), torch.profiler.profile(activities=activities, profile_memory=True) as p:
        loss, metrics = chunked_head_loss(hidden, weight, fields, loss_of_logits, chunk=4)
    events = p.events()
    backward = [e.name for e in events if e.name.startswith("autograd::engine::evaluate")]
    weight_bytes = vocab * width * 4
    weight_sized = [e for e in events if e.cpu_memory_usage == weight_bytes]
    assert seen == [False] * len(seen) and len(seen) == -(-B * S // 4)
    assert backward == []
    assert weight_sized == []
    assert weight.grad is None and not loss.requires_grad
    # The same loss and metrics as training's path (with gradients) computes.
    trained, trained_metrics = chunked_head_loss(
        hidden, weight, fields, lambda z, p: loss_fn(z, p, count), chunk=4
    )
    assert torch.equal(loss, trained.detach())  # the same numbers, bit for bit
    assert metrics.keys() == trained_metrics.keys()
    for name, value in metrics.items():
        assert torch.equal(value, trained_metrics[name])
