"""The distillation loss: sparse top-k KL between student and teacher (docs/loss.md).

- `topk_kl` / `topk_kl_with_stats`: the per-position divergence (functional; Triton or torch).
- `topk_kl_weighted_sum`: sum(weights * divergence), its gradient pre-weighted in forward.
- `DistillationLossFn`: the masked, globally normalized training loss, with metrics.
- `PolicyGradientLossFn`: OPD as RL, an importance-sampled, PPO-clipped policy-gradient loss
  over per-token advantages, optionally plus the top-k distillation loss.
- `NLLLossFn`: the supervised baseline, the negative log-likelihood of the tokens there.
- `build_loss_mask`: aligns token masks with the logits (position t predicts token t + 1).
- `validate_teacher_topk`: the data-dependent input checks (one host sync; once per batch).
"""

from nemo_opd.losses.checks import EMPTY_INDEX, check_topk_kl_inputs, validate_teacher_topk
from nemo_opd.losses.distillation_loss import METRIC_NAMES, DistillationLossFn, build_loss_mask
from nemo_opd.losses.divergence import EPS, KL_TYPES, TAILS, TopkKLParams, topk_divergence
from nemo_opd.losses.nll import NLL_METRIC_NAMES, NLLLossFn
from nemo_opd.losses.policy_gradient import POLICY_GRADIENT_METRIC_NAMES, PolicyGradientLossFn
from nemo_opd.losses.topk_kl import (
    TopkKLStats,
    topk_kl,
    topk_kl_weighted_sum,
    topk_kl_with_stats,
)

__all__ = [
    "EPS",
    "KL_TYPES",
    "METRIC_NAMES",
    "NLL_METRIC_NAMES",
    "POLICY_GRADIENT_METRIC_NAMES",
    "TAILS",
    "DistillationLossFn",
    "NLLLossFn",
    "PolicyGradientLossFn",
    "TopkKLParams",
    "TopkKLStats",
    "build_loss_mask",
    "EMPTY_INDEX",
    "check_topk_kl_inputs",
    "topk_divergence",
    "topk_kl",
    "topk_kl_weighted_sum",
    "topk_kl_with_stats",
    "validate_teacher_topk",
]
