"""The training loss of on-policy distillation: masked top-k KL, globally normalized.

    loss = sum_{b,t} loss_mask[b, t] * topk_kl(logits[b, t], teacher[b, t]) / global_valid_toks

global_valid_toks counts the valid positions of the whole global batch (all microbatches and
all data-parallel ranks), so summing the losses (and gradients) of the microbatches and ranks
gives exactly the single-batch answer.

Alignment: the logits at position t predict token t + 1, and so do the teacher's top-k at
position t. Position t is graded when token t + 1 is a trained token (an assistant token of a
sample that counts): loss_mask[:, t] = token_mask[:, t + 1] * sample_mask. The last position,
and in packed rows the last position of every packed sequence, is never graded.
"""

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_opd.losses.checks import global_vocab_size, validate_teacher_topk
from nemo_opd.losses.divergence import DEFAULT_PARAMS, TopkKLParams
from nemo_opd.losses.topk_kl import Implementation, resolve_implementation, topk_kl_weighted_sum

METRIC_NAMES = (
    "loss",
    "forward_kl",
    "reverse_kl",
    "teacher_tail_mass",
    "student_topk_mass",
    "top1_agreement",
    "num_valid_tokens",
)
"""Keys of the metrics dict. All but num_valid_tokens are sums over this call's valid positions
divided by global_valid_toks: summed over microbatches and data-parallel ranks they give the
global per-token mean. num_valid_tokens is this call's count; sum it the same way. Tensor-
parallel ranks hold identical values (do not sum over them)."""


def build_loss_mask(
    token_mask: torch.Tensor,
    sample_mask: torch.Tensor | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> torch.Tensor:
    """The per-position loss mask, aligned with the logits (no host synchronization).

    Args:
        token_mask: [B, S] 1 on tokens that are trained (assistant/generated tokens).
        sample_mask: optional [B] 1 for samples that count.
        cu_seqlens: optional [num_seqs + 1] cumulative lengths of the sequences packed
            into the row-major flattened [B * S] token stream (for one packed row, the usual
            cu_seqlens). The last position of every sequence is masked, so nothing is graded
            across a boundary.

    Returns:
        [B, S] float32 mask with loss_mask[:, t] = token_mask[:, t + 1] * sample_mask and the
        last position (of each row, and of each packed sequence) 0.
    """
    if token_mask.dim() != 2:
        raise ValueError(f"token_mask must be [B, S], got {tuple(token_mask.shape)}")
    mask = torch.zeros(token_mask.shape, dtype=torch.float32, device=token_mask.device)
    mask[:, :-1] = token_mask[:, 1:].float()
    if sample_mask is not None:
        if sample_mask.shape != token_mask.shape[:1]:
            raise ValueError(
                f"sample_mask must be [B] = [{token_mask.shape[0]}], got {tuple(sample_mask.shape)}"
            )
        mask *= sample_mask.float().unsqueeze(-1)
    if cu_seqlens is not None:
        # Position t ends a sequence when t + 1 is in cu_seqlens[1:]; zero-length sequences
        # only repeat a boundary that is already there.
        total = token_mask.numel()
        hits = torch.zeros(total + 1, dtype=torch.float32, device=token_mask.device)
        ends = cu_seqlens[1:].to(device=token_mask.device, dtype=torch.long)
        hits.index_add_(0, ends, torch.ones_like(ends, dtype=torch.float32))
        mask = mask * (hits[1:] == 0).reshape(token_mask.shape)
    return mask


class DistillationLossFn:
    """Masked, globally normalized top-k KL between the student and the teacher.

        DistillationLossFn(params=TopkKLParams(kl_type="forward"), implementation="torch")
        DistillationLossFn.from_config(cfg.loss_fn)

    Args:
        params: the divergence options (kl_type, mixed_kl_weight, jsd_beta, tail,
            temperature).
        implementation: "triton", "torch" or "auto" (see `topk_kl`).
        inplace_grad: let the kernel overwrite the logits with their gradient (saves one
            logits-sized buffer; the caller must not use the logits after the loss).
        validate_inputs: run `validate_teacher_topk` on every call (a host sync; a debugging
            aid: engines should validate the teacher's output once per batch instead).
    """

    def __init__(
        self,
        *,
        params: TopkKLParams = DEFAULT_PARAMS,
        implementation: Implementation = "auto",
        inplace_grad: bool = False,
        validate_inputs: bool = False,
    ) -> None:
        if not isinstance(params, TopkKLParams):
            raise TypeError(
                f"params must be a TopkKLParams, got {type(params).__name__} (build from a "
                "loss_fn config section with DistillationLossFn.from_config)"
            )
        resolve_implementation(implementation, torch.device("cpu"))  # validates the name
        self.params = params
        self.implementation = implementation
        self.inplace_grad = inplace_grad
        self.validate_inputs = validate_inputs

    @classmethod
    def from_config(
        cls, loss_cfg: Any, *, inplace_grad: bool = False, validate_inputs: bool = False
    ) -> "DistillationLossFn":
        """Build from the loss_fn config section: any object with the attributes kl_type,
        mixed_kl_weight, jsd_beta, tail, temperature and implementation."""
        names = [field.name for field in dataclasses.fields(TopkKLParams)]
        params = TopkKLParams(**{name: getattr(loss_cfg, name) for name in names})
        return cls(
            params=params,
            implementation=loss_cfg.implementation,
            inplace_grad=inplace_grad,
            validate_inputs=validate_inputs,
        )

    @property
    def input_fields(self) -> tuple[str, ...]:
        """The per-position fields of `data` the engine passes (it cuts them into
        microbatches): the aligned loss mask and the teacher's top-k."""
        return ("loss_mask", "teacher_topk_logprobs", "teacher_topk_indices")

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
            logits: [B, S, V_local] student logits (the local vocab shard under tensor
                parallelism, first global id `vocab_start`; the local sequence shard under
                context parallelism).
            data: "teacher_topk_logprobs" [B, S, k] fp32, "teacher_topk_indices" [B, S, k]
                int32/int64 global ids, and either "loss_mask" [B, S] already aligned (needed
                for context-parallel shards: align on the full sequence, then shard), or
                "token_mask" [B, S] with optional "sample_mask" [B] and "cu_seqlens" (see
                `build_loss_mask`).
            global_valid_toks: the number of valid positions in the whole global batch.
            vocab_start, tp_group: the tensor-parallel vocab shard and group.

        Returns:
            (loss, a scalar with gradient; metrics, a dict of detached scalars, see
            METRIC_NAMES).
        """
        logprobs = data["teacher_topk_logprobs"]
        indices = data["teacher_topk_indices"]
        if "loss_mask" in data:
            loss_mask = data["loss_mask"].float()
        else:
            loss_mask = build_loss_mask(
                data["token_mask"], data.get("sample_mask"), data.get("cu_seqlens")
            )
        if logits.dim() != 3 or loss_mask.shape != logits.shape[:2]:
            raise ValueError(
                f"logits must be [B, S, V] and the mask [B, S]; got {tuple(logits.shape)} and "
                f"{tuple(loss_mask.shape)}"
            )
        valid = loss_mask != 0
        logprobs, indices = _neutral_where_masked(logprobs, indices, valid)
        if self.validate_inputs:
            vocab = global_vocab_size(logits.shape[-1], tp_group)
            validate_teacher_topk(logprobs, indices, vocab, mask=valid)

        denom = torch.as_tensor(global_valid_toks, dtype=torch.float32, device=logits.device)
        denom = denom.clamp_min(1.0)
        loss, stats = topk_kl_weighted_sum(
            logits,
            logprobs,
            indices,
            loss_mask / denom,
            params=self.params,
            vocab_start=vocab_start,
            tp_group=tp_group,
            implementation=self.implementation,
            inplace_grad=self.inplace_grad,
        )
        metrics = {"loss": loss.detach()}
        for name, value in stats._asdict().items():
            metrics[name] = torch.where(valid, value, 0.0).sum() / denom
        metrics["num_valid_tokens"] = valid.sum().float()
        return loss, metrics


def _neutral_where_masked(logprobs, indices, valid):
    """Replace the teacher's rows at masked positions by a uniform top-k over ids 0..k-1.

    Masked positions are computed and then weighted by 0; whatever the teacher sent there
    (padding, NaN) must not turn 0 * value into NaN in the loss or the gradient.
    """
    k = indices.shape[-1]
    keep = valid.unsqueeze(-1)
    uniform = torch.full_like(logprobs, -math.log(k))
    ids = torch.arange(k, device=indices.device, dtype=indices.dtype).expand_as(indices)
    return torch.where(keep, logprobs, uniform), torch.where(keep, indices, ids)
