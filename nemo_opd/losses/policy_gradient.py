"""On-policy distillation as reinforcement learning: an importance-sampled, PPO-clipped
policy-gradient loss over per-token advantages.

The trainer forms the advantages (for on-policy distillation, minus the return of the sampled
reverse KL k_t = log pi_student(y_t) - log pi_teacher(y_t); for a reward, GRPO and the like);
this module only turns them into a loss. Per position t, with y the sampled token t + 1:

    logp_t = log softmax(logits_t / temperature)[y]          (differentiable)
    r_t    = exp(logp_t - old_t)                             (pi_theta / pi_old)
    pg_t   = -min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
    w_t    = min(exp(old_t - sampler_t), is_cap)             (pi_old / pi_sampler, detached)
    loss   = sum_t loss_mask_t w_t pg_t / global_valid_toks  [+ topk_kl_coef * top-k KL loss]

r is PPO's ratio: old is the student's log-prob recomputed by the trainer at the start of the
step, so r = 1 on the step's first update and the clip bounds how far later updates (several
minibatches per step) move. w corrects for the sampler: vLLM's log-probs differ from the
trainer's (other kernels, other precision, or weights a step behind), so the samples come
from pi_sampler, not pi_old; truncating w at is_cap (truncated importance sampling) bounds its
variance.

Alignment (as everywhere in nemo_opd): position t's logits predict token t + 1, and every
per-position field is aligned the same way: field[:, t] concerns token t + 1.

Metrics (POLICY_GRADIENT_METRIC_NAMES, detached scalars). Those ending in "_min" / "_max" are
the min / max over this call's valid positions (+inf / -inf when there is none) and combine
over microbatches and data-parallel ranks by min / max; the engine reduces every metric by its
name this way. num_valid_tokens is this call's count. Every other metric is a sum over this
call's valid positions divided by global_valid_toks, so that summed over microbatches and
data-parallel ranks it is the global per-token mean (DistillationLossFn's convention). With
the top-k term the top-k loss's metrics follow, their names prefixed "topk_". Tensor-parallel
ranks hold identical values.
"""

from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs_with_grad
from nemo_opd.losses.distillation_loss import DistillationLossFn

POLICY_GRADIENT_METRIC_NAMES = (
    "loss",
    "pg_loss",
    "clip_fraction",
    "ratio_mean",
    "ratio_min",
    "ratio_max",
    "is_weight_mean",
    "is_truncated_fraction",
    "num_valid_tokens",
)
"""Keys of PolicyGradientLossFn's metrics dict (without the top-k term's "topk_*" keys): see
the module docstring for how each combines over microbatches and ranks."""

TOPK_METRIC_PREFIX = "topk_"


class PolicyGradientLossFn:
    """Importance-sampled, PPO-clipped policy-gradient loss, globally normalized.

        PolicyGradientLossFn(clip_eps_low=0.2, clip_eps_high=0.28, is_cap=2.0)
        PolicyGradientLossFn.from_config(cfg.objective, cfg.loss_fn, temperature)

    With both clip bounds None and is_cap None the loss is -sum (pi_theta / pi_sampler) A /
    global_valid_toks: w is detached and r w = pi_theta / pi_sampler, so value and gradient are
    those of tinker-cookbook's (and SkyRL's) importance_sampling loss.

    Args:
        clip_eps_low: clip r from below at 1 - eps; None: no lower clip.
        clip_eps_high: clip r from above at 1 + eps; None: no upper clip.
        sampler_correction: weight each position by w = pi_old / pi_sampler (reads
            "sampler_logprobs"); False: w = 1.
        is_cap: truncate w at this value; None: untruncated.
        temperature: the student's log-probs are log softmax(logits / temperature), the
            temperature old_logprobs (and the sampler's) were computed at.
        topk_kl: the top-k divergence loss added to this one (the hybrid); it is given the
            raw logits and applies its own temperature.
        topk_kl_coef: its weight; 0 leaves it out.
    """

    def __init__(
        self,
        *,
        clip_eps_low: float | None = 0.2,
        clip_eps_high: float | None = 0.2,
        sampler_correction: bool = True,
        is_cap: float | None = 2.0,
        temperature: float = 1.0,
        topk_kl: DistillationLossFn | None = None,
        topk_kl_coef: float = 0.0,
    ) -> None:
        for name, eps in (("clip_eps_low", clip_eps_low), ("clip_eps_high", clip_eps_high)):
            if eps is not None and not eps >= 0:
                raise ValueError(f"{name} must be >= 0 or None (no clipping), got {eps}")
        if is_cap is not None and not is_cap > 0:
            raise ValueError(f"is_cap must be > 0 or None (no truncation), got {is_cap}")
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if not topk_kl_coef >= 0:
            raise ValueError(f"topk_kl_coef must be >= 0, got {topk_kl_coef}")
        if topk_kl_coef > 0 and topk_kl is None:
            raise ValueError(f"topk_kl_coef is {topk_kl_coef} but no topk_kl loss was given")
        if topk_kl is not None and topk_kl.inplace_grad:
            # It would overwrite the logits that this loss's backward still reads.
            raise ValueError("topk_kl must not use inplace_grad inside PolicyGradientLossFn")
        self.clip_eps_low = clip_eps_low
        self.clip_eps_high = clip_eps_high
        self.sampler_correction = sampler_correction
        self.is_cap = is_cap
        self.temperature = temperature
        self.topk_kl = topk_kl if topk_kl_coef > 0 else None
        self.topk_kl_coef = topk_kl_coef

    @classmethod
    def from_config(
        cls, objective_cfg: Any, loss_cfg: Any, temperature: float, topk_kl: Any = None
    ) -> "PolicyGradientLossFn":
        """Build from the objective section (clip_eps_low, clip_eps_high, sampler_correction,
        is_cap, topk_kl_coef) and, for the divergence term when topk_kl_coef > 0, the loss_fn
        section (see DistillationLossFn.from_config) or the given `topk_kl` loss (one with the
        same call, e.g. the full-vocabulary one); `temperature` is the sampling one."""
        coef = objective_cfg.topk_kl_coef
        if coef > 0 and topk_kl is None:
            topk_kl = DistillationLossFn.from_config(loss_cfg)
        return cls(
            clip_eps_low=objective_cfg.clip_eps_low,
            clip_eps_high=objective_cfg.clip_eps_high,
            sampler_correction=objective_cfg.sampler_correction,
            is_cap=objective_cfg.is_cap,
            temperature=temperature,
            topk_kl=topk_kl if coef > 0 else None,
            topk_kl_coef=coef,
        )

    @property
    def input_fields(self) -> tuple[str, ...]:
        """The per-position fields of `data` this loss reads."""
        fields = ("loss_mask", "targets", "old_logprobs", "advantages")
        if self.sampler_correction:
            fields += ("sampler_logprobs",)
        if self.topk_kl is not None:
            fields += tuple(f for f in self.topk_kl.input_fields if f not in fields)
        return fields

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
                parallelism, first global id `vocab_start`; the local sequence shard under
                context parallelism).
            data: [B, S] per-position fields, aligned with the logits: "loss_mask" (float,
                used as weights), "targets" (int64 global ids), "old_logprobs",
                "advantages", "sampler_logprobs" (with sampler_correction), and the top-k
                term's fields when it is on. Masked positions may hold anything (NaN, inf,
                any target id).
            global_valid_toks: the number of valid positions in the whole global batch
                (clamped to >= 1).
            vocab_start, tp_group: the tensor-parallel vocab shard and group.

        Returns:
            (loss, a scalar with gradient; metrics, a dict of detached scalars, see
            POLICY_GRADIENT_METRIC_NAMES).
        """
        loss_mask, fields = self._read_fields(logits, data)
        valid = loss_mask != 0
        denom = torch.as_tensor(global_valid_toks, dtype=torch.float32, device=logits.device)
        denom = denom.clamp_min(1.0)

        # Divided in the logits' dtype, as the engine's get_logprobs does for old_logprobs, so
        # that r is exactly 1 wherever the forward pass is reproducible.
        scaled = logits if self.temperature == 1.0 else logits / self.temperature
        flat = scaled.reshape(-1, scaled.shape[-1])
        targets = fields["targets"].reshape(-1)
        logp = vocab_parallel_logprobs_with_grad(flat, targets, vocab_start, tp_group)
        logp = logp.reshape(loss_mask.shape)
        ratio = torch.exp(logp - fields["old_logprobs"])
        pg, clipped = self._clipped_surrogate(ratio, fields["advantages"])
        weight, truncated = self._sampler_weights(fields)
        pg_loss = (loss_mask * weight * pg).sum() / denom

        ratio_value = ratio.detach()
        metrics = {
            "loss": pg_loss.detach(),
            "pg_loss": pg_loss.detach(),
            "clip_fraction": (valid & clipped).sum() / denom,
            "ratio_mean": torch.where(valid, ratio_value, 0.0).sum() / denom,
            "ratio_min": _extreme(ratio_value, valid, torch.amin, torch.inf),
            "ratio_max": _extreme(ratio_value, valid, torch.amax, -torch.inf),
            "is_weight_mean": torch.where(valid, weight, 0.0).sum() / denom,
            "is_truncated_fraction": (valid & truncated).sum() / denom,
            "num_valid_tokens": valid.sum().float(),
        }
        if self.topk_kl is None:
            return pg_loss, metrics
        topk_loss, topk_metrics = self.topk_kl(
            logits, data, global_valid_toks, vocab_start=vocab_start, tp_group=tp_group
        )
        loss = pg_loss + self.topk_kl_coef * topk_loss
        metrics["loss"] = loss.detach()
        metrics.update({TOPK_METRIC_PREFIX + k: v for k, v in topk_metrics.items()})
        return loss, metrics

    def _read_fields(self, logits, data):
        """(loss_mask [B, S] fp32, the other fields with neutral values where it is 0).

        Masked positions get old = sampler = advantage = 0: then r = exp(logp) <= 1, w = 1 and
        pg = 0, all finite, so their weight of 0 cannot turn into NaN (0 * NaN) in the loss or
        the gradient, whatever was sent there.
        """
        loss_mask = data["loss_mask"].float()
        if logits.dim() != 3 or loss_mask.shape != logits.shape[:2]:
            raise ValueError(
                f"logits must be [B, S, V] and the mask [B, S]; got {tuple(logits.shape)} and "
                f"{tuple(loss_mask.shape)}"
            )
        valid = loss_mask != 0
        names = ["old_logprobs", "advantages"]
        if self.sampler_correction:
            names.append("sampler_logprobs")
        for name in ["targets", *names]:
            if data[name].shape != loss_mask.shape:
                raise ValueError(
                    f"{name} must be [B, S] = {list(loss_mask.shape)}, got {list(data[name].shape)}"
                )
        # Any target id is harmless: one outside every shard only gives logp = -logsumexp.
        fields = {"targets": data["targets"]}
        for name in names:
            fields[name] = torch.where(valid, data[name].float(), 0.0)
        return loss_mask, fields

    def _clipped_surrogate(self, ratio, advantages):
        """(pg [B, S], where the clipped term was chosen and differs from the unclipped)."""
        unclipped = ratio * advantages
        if self.clip_eps_low is None and self.clip_eps_high is None:
            return -unclipped, torch.zeros_like(unclipped, dtype=torch.bool)
        low = None if self.clip_eps_low is None else 1.0 - self.clip_eps_low
        high = None if self.clip_eps_high is None else 1.0 + self.clip_eps_high
        clipped_term = torch.clamp(ratio, low, high) * advantages
        # The pessimistic bound: where clipping lowers the objective, take the clipped
        # term (its gradient is 0 outside the range); where they are equal, the unclipped one.
        clipped = clipped_term < unclipped
        return -torch.where(clipped, clipped_term, unclipped), clipped

    def _sampler_weights(self, fields):
        """(w = min(pi_old / pi_sampler, is_cap) [B, S] detached, where w was truncated)."""
        old = fields["old_logprobs"]
        if not self.sampler_correction:
            return torch.ones_like(old), torch.zeros_like(old, dtype=torch.bool)
        raw = torch.exp(old - fields["sampler_logprobs"])
        if self.is_cap is None:
            return raw, torch.zeros_like(raw, dtype=torch.bool)
        return raw.clamp_max(self.is_cap), raw > self.is_cap


def _extreme(values, valid, reduce, empty):
    """reduce (amin / amax) of `values` over the valid positions; `empty` when there is none."""
    fill = torch.full((1,), empty, dtype=values.dtype, device=values.device)
    return reduce(torch.cat([torch.where(valid, values, empty).reshape(-1), fill]))
