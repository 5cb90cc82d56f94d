"""The supervised baseline: negative log-likelihood of the tokens there, globally normalized.

    loss = -sum_t loss_mask_t log softmax(logits_t / temperature)[y_t] / global_valid_toks

with y_t the token at position t + 1 (position t's logits predict it, as everywhere in
nemo_opd). The same normalization as the other losses: summed over microbatches and
data-parallel ranks, it is the per-token mean over the global batch. objective.loss sft trains
on the dataset's responses with it (docs/gkd.md), so SFT and distillation share the data,
optimizer, logging and validation of one loop.

Metrics: "loss" (a per-token mean, summing over microbatches and ranks as above) and
"num_valid_tokens" (this call's count). Tensor-parallel ranks hold identical values.
"""

from collections.abc import Mapping

import torch
import torch.distributed as dist

from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs_with_grad

NLL_METRIC_NAMES = ("loss", "num_valid_tokens")


class NLLLossFn:
    """Masked negative log-likelihood of the targets, divided by the global valid-token count.

    Args:
        temperature: the student's log-probs are log softmax(logits / temperature).
    """

    input_fields = ("loss_mask", "targets")
    """The per-position fields of `data` this loss reads."""

    def __init__(self, temperature: float = 1.0) -> None:
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = temperature

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_toks: torch.Tensor | int | float,
        *,
        vocab_start: int = 0,
        tp_group: dist.ProcessGroup | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and metrics of one microbatch.

        Args:
            logits: [B, S, V_local] raw student logits (the local vocab shard under tensor
                parallelism, first global id `vocab_start`).
            data: "loss_mask" [B, S] (float weights) and "targets" [B, S] (int64 global ids);
                masked positions may hold any target id.
            global_valid_toks: valid positions in the whole global batch (clamped to >= 1).
            vocab_start, tp_group: the tensor-parallel vocab shard and group.
        """
        loss_mask = data["loss_mask"].float()
        if logits.dim() != 3 or loss_mask.shape != logits.shape[:2]:
            raise ValueError(
                f"logits must be [B, S, V] and the mask [B, S]; got {tuple(logits.shape)} and "
                f"{tuple(loss_mask.shape)}"
            )
        if data["targets"].shape != loss_mask.shape:
            raise ValueError(
                f"targets must be [B, S] = {list(loss_mask.shape)}, got "
                f"{list(data['targets'].shape)}"
            )
        denom = torch.as_tensor(global_valid_toks, dtype=torch.float32, device=logits.device)
        denom = denom.clamp_min(1.0)
        scaled = logits if self.temperature == 1.0 else logits / self.temperature
        flat = scaled.reshape(-1, scaled.shape[-1])
        logp = vocab_parallel_logprobs_with_grad(
            flat, data["targets"].reshape(-1), vocab_start, tp_group
        ).reshape(loss_mask.shape)
        valid = loss_mask != 0
        # Masked positions are dropped before the weights apply: a -inf log-prob there (a
        # padding target, a masked logit row) must not become 0 * inf = NaN.
        loss = -(loss_mask * torch.where(valid, logp, 0.0)).sum() / denom
        return loss, {"loss": loss.detach(), "num_valid_tokens": valid.sum().float()}
