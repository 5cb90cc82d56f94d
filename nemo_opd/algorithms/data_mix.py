"""Which data a step trains on: the student's own rollouts (on-policy) or the dataset's
responses (off-policy), mixed as TRL's GKD mixes them with lmbda.

TRL draws once per batch and generates on-policy when the draw is at most lmbda; here the draw
of step s is u_s = random.Random(f"{seed}-lmbda-{s}").random(), and step s is on-policy when
u_s < lmbda. So lmbda 1 makes every step on-policy and 0 none, and a step's kind depends only
on (seed, step): a resumed run mixes exactly as an uninterrupted one.
"""

import random

from nemo_opd.config import DistillationConfig


def on_policy_share(cfg: DistillationConfig) -> float:
    """distillation.lmbda, or its default: 1 (every step on-policy), 0 for objective.loss sft."""
    if cfg.distillation.lmbda is not None:
        return cfg.distillation.lmbda
    return 0.0 if cfg.objective.loss == "sft" else 1.0


def is_on_policy_step(cfg: DistillationConfig, step: int) -> bool:
    """Whether `step` trains on the student's own rollouts (see the module docstring)."""
    share = on_policy_share(cfg)
    if share in (0.0, 1.0):
        return share == 1.0
    return random.Random(f"{cfg.distillation.seed}-lmbda-{step}").random() < share
