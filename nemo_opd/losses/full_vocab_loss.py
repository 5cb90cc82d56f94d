"""The training loss when the teacher sends its hidden states: the full vocabulary, or the
student's own top-k (loss_fn.support; docs/loss.md, "The full vocabulary").

The engine turns the teacher's hidden states into its logits with the teacher's LM head, chunk
by chunk (policy/engines/teacher_head.py), and calls this loss with both models' logits of the
chunk, so [N, V] exists for neither model:

    support full          the exact divergence over every id (full_vocab.py)
    support student_topk  the divergence over the student's own k most likely ids S (chosen
                          without gradient) and one tail bucket, with the teacher's exact
                          log-probs at S: the top-k loss (topk_kl.py) on S instead of the
                          teacher's top-k. With the reverse KL this is the "reverse KL over the
                          student's top-k" (the student's mass where it puts it, graded by the
                          teacher, and its tail).

    loss = sum_{b,t} loss_mask[b, t] * divergence[b, t] / global_valid_toks   (as the top-k loss)
"""

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_opd.distributed.vocab_parallel import vocab_parallel_topk
from nemo_opd.losses.distillation_loss import build_loss_mask
from nemo_opd.losses.divergence import DEFAULT_PARAMS, TopkKLParams
from nemo_opd.losses.full_vocab import full_vocab_kl_weighted_sum, teacher_logprobs_at
from nemo_opd.losses.teacher_logits import TeacherLogits
from nemo_opd.losses.topk_kl import Implementation, topk_kl_weighted_sum

SUPPORTS = ("teacher_topk", "full", "student_topk")
"""loss_fn.support: the ids the divergence runs over (teacher_topk: DistillationLossFn)."""


class FullVocabDistillationLossFn:
    """Masked, globally normalized divergence from both models' logits (module docstring).

        FullVocabDistillationLossFn(params=TopkKLParams(kl_type="reverse"), support="full")

    Args:
        params: kl_type, mixed_kl_weight, jsd_beta, temperature (the student's), and tail
            (student_topk only).
        support: "full" or "student_topk".
        k: student_topk: how many of the student's ids.
        teacher_temperature: the teacher's logits are divided by it (None: params.temperature).
        implementation: student_topk: the top-k loss's implementation ("auto", "triton",
            "torch").
    """

    def __init__(
        self,
        *,
        params: TopkKLParams = DEFAULT_PARAMS,
        support: str = "full",
        k: int | None = None,
        teacher_temperature: float | None = None,
        implementation: Implementation = "auto",
    ) -> None:
        if support not in SUPPORTS[1:]:
            raise ValueError(f"support must be one of {SUPPORTS[1:]}, got {support!r}")
        if support == "student_topk" and (k is None or k < 1):
            raise ValueError(f"support student_topk needs k >= 1, got {k}")
        self.params = params
        self.support = support
        self.k = k
        self.teacher_temperature = teacher_temperature or params.temperature
        self.implementation = implementation
        self.inplace_grad = False  # the student's logits are never overwritten here

    @classmethod
    def from_config(
        cls, loss_cfg: Any, *, k: int, teacher_temperature: float | None = None
    ) -> "FullVocabDistillationLossFn":
        """Build from the loss_fn config section (kl_type, mixed_kl_weight, jsd_beta, tail,
        temperature, implementation, support); k: the student's top-k size."""
        names = [field.name for field in dataclasses.fields(TopkKLParams)]
        params = TopkKLParams(**{name: getattr(loss_cfg, name) for name in names})
        return cls(
            params=params,
            support=loss_cfg.support,
            k=k,
            teacher_temperature=teacher_temperature,
            implementation=loss_cfg.implementation,
        )

    @property
    def input_fields(self) -> tuple[str, ...]:
        """The per-position fields the engine passes: the aligned loss mask and the teacher's
        hidden states (which the engine turns into "teacher_logits" per chunk)."""
        return ("loss_mask", "teacher_hidden")

    def __call__(
        self,
        logits: torch.Tensor,
        data: Mapping[str, torch.Tensor],
        global_valid_toks: torch.Tensor | int | float,
        *,
        vocab_start: int = 0,
        tp_group: dist.ProcessGroup | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Loss and metrics of one microbatch (or chunk).

        Args:
            logits: [B, S, V_local] the student's logits (this rank's vocabulary shard).
            data: "teacher_logits" [B, S, V_local] over the same ids (a tensor, or a
                TeacherLogits making them block by block), and "loss_mask" [B, S]
                (or "token_mask" with optional "sample_mask", as build_loss_mask takes).
            global_valid_toks: the valid positions of the whole global batch.
            vocab_start, tp_group: the tensor-parallel shard and group.

        Returns:
            (loss, a scalar with gradient; metrics, the top-k loss's names: loss, forward_kl,
            reverse_kl, teacher_tail_mass, student_topk_mass, top1_agreement,
            num_valid_tokens).
        """
        teacher = data["teacher_logits"]
        if "loss_mask" in data:
            loss_mask = data["loss_mask"].float()
        else:
            loss_mask = build_loss_mask(data["token_mask"], data.get("sample_mask"))
        denom = torch.as_tensor(global_valid_toks, dtype=torch.float32, device=logits.device)
        weights = loss_mask / denom.clamp_min(1.0)
        if self.support == "full":
            loss, stats = full_vocab_kl_weighted_sum(
                logits, teacher, weights, params=self.params,
                teacher_temperature=self.teacher_temperature, tp_group=tp_group,
            )  # fmt: skip
            stats = {
                **stats._asdict(),
                "teacher_tail_mass": torch.zeros_like(stats.forward_kl),
                "student_topk_mass": torch.ones_like(stats.forward_kl),
            }
        else:
            loss, topk_stats = self._student_topk(logits, teacher, weights, vocab_start, tp_group)
            stats = topk_stats._asdict()
        valid = loss_mask != 0
        metrics = {"loss": loss.detach()}
        for name in ("forward_kl", "reverse_kl", "teacher_tail_mass", "student_topk_mass"):
            metrics[name] = torch.where(valid, stats[name], 0.0).sum() / denom.clamp_min(1.0)
        metrics["top1_agreement"] = torch.where(
            valid, stats["top1_agreement"], 0.0
        ).sum() / denom.clamp_min(1.0)
        metrics["num_valid_tokens"] = valid.sum().float()
        return loss, metrics

    def _student_topk(self, logits, teacher, weights, vocab_start, tp_group):
        """The top-k loss over the student's own k most likely ids, the teacher's exact
        log-probs there."""
        lead, vocab_local = logits.shape[:-1], logits.shape[-1]
        flat = logits.detach().reshape(-1, vocab_local)
        _, ids = vocab_parallel_topk(flat / self.params.temperature, self.k, vocab_start, tp_group)
        values = teacher_logprobs_at(
            TeacherLogits.of(teacher), ids, vocab_start, self.teacher_temperature, tp_group
        )
        return topk_kl_weighted_sum(
            logits, values.reshape(*lead, -1), ids.reshape(*lead, -1), weights,
            params=self.params, vocab_start=vocab_start, tp_group=tp_group,
            implementation=self.implementation,
        )  # fmt: skip
