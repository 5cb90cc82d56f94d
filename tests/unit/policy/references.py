"""Independent single-process references: a plain Hugging Face forward/backward in float32."""

import torch
from transformers import AutoModelForCausalLM

from nemo_opd.losses import build_loss_mask


def load_reference(model_dir: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=torch.float32, attn_implementation="eager"
    )


def reference_logits(model, batch: dict) -> torch.Tensor:
    """[B, S, V] logits of right-padded rows (causal attention; padding comes after)."""
    return model(input_ids=batch["input_ids"]).logits.float()


def reference_logprobs(model, batch: dict, temperature: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logp = torch.log_softmax(reference_logits(model, batch) / temperature, dim=-1)
    targets = torch.roll(batch["input_ids"], -1, dims=1)
    out = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    positions = torch.arange(out.shape[1])
    return torch.where(positions < batch["input_lengths"].unsqueeze(1) - 1, out, 0.0)


def reference_topk(
    model, batch: dict, k: int, temperature: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        logp = torch.log_softmax(reference_logits(model, batch) / temperature, dim=-1)
    return logp.topk(k, dim=-1)


def reference_train(
    model, batch: dict, loss_fn, cfg, steps_rows: int, optimizer: tuple | None = None
):
    """Per-step losses, gradient norms (before clipping), final parameters and (optimizer,
    schedule) of AdamW with clipping and linear warmup over the parameters that require grad
    (a LoRA model: its adapters), on one process; `optimizer` continues an earlier call's."""
    opt = cfg.optimizer
    trainable = [p for p in model.parameters() if p.requires_grad]
    if optimizer is None:
        lr = cfg.lora.learning_rate if cfg.lora.enabled and cfg.lora.learning_rate else opt.lr
        adamw = torch.optim.AdamW(
            trainable, lr=lr, betas=opt.betas, eps=opt.eps,
            weight_decay=opt.weight_decay, foreach=False,
        )  # fmt: skip
        warmup = cfg.scheduler.warmup_steps
        schedule = torch.optim.lr_scheduler.LambdaLR(
            adamw, lambda s: (s + 1) / (warmup + 1) if s < warmup else 1.0
        )
        optimizer = (adamw, schedule)
    optimizer, sched = optimizer
    losses, norms = [], []
    size = batch["input_ids"].shape[0]
    for start in range(0, size, steps_rows):
        rows = {k: v[start : start + steps_rows] for k, v in batch.items()}
        count = build_loss_mask(rows["token_mask"], rows["sample_mask"]).sum()
        optimizer.zero_grad()
        loss, _ = loss_fn(reference_logits(model, rows), rows, count)
        loss.backward()
        norms.append(torch.nn.utils.clip_grad_norm_(trainable, cfg.max_grad_norm).item())
        optimizer.step()
        sched.step()
        losses.append(loss.item())
    return losses, norms, dict(model.named_parameters()), (optimizer, sched)
