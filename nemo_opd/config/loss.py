"""The distillation loss section."""

from typing import Literal

from pydantic import Field

from nemo_opd.config.base import Section


class LossConfig(Section):
    """Which divergence between teacher and student is minimized, and how it is computed.

    The fields are the keyword arguments of `nemo_opd.losses.topk_kl`.
    """

    kl_type: Literal["forward", "reverse", "mixed", "jsd"] = "reverse"
    """forward KL(P||Q), reverse KL(Q||P), mixed (a weighted sum of both) or the generalized
    Jensen-Shannon divergence, with P the teacher and Q the student."""

    mixed_kl_weight: float = Field(0.5, ge=0, le=1)
    """For kl_type mixed: the weight w of the FORWARD KL (the reverse KL gets 1 - w)."""

    jsd_beta: float = Field(0.5, ge=0, le=1)
    """For kl_type jsd: the mixture weight beta of M = beta P + (1 - beta) Q; must be strictly
    between 0 and 1 when kl_type is jsd (at 0 or 1 the divergence is identically zero)."""

    tail: Literal["bucket", "renormalize"] = "bucket"
    """bucket: the teacher's top-k tokens plus one bucket for the rest of the vocabulary (exact
    at k = V); renormalize: both distributions renormalized over the top-k."""

    temperature: float = Field(1.0, gt=0)
    """The student's logits are divided by this before the softmax."""

    implementation: Literal["auto", "triton", "torch"] = "auto"
    """The fused Triton kernel, the plain-torch implementation, or auto (Triton where it runs)."""
