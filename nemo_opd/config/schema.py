"""DistillationConfig: the whole run, one validated section per component."""

from pydantic import Field, model_validator

from nemo_opd.config.base import Section
from nemo_opd.config.checks import find_problems
from nemo_opd.config.data import DataConfig, EnvConfig
from nemo_opd.config.loop import DistillationLoopConfig
from nemo_opd.config.loss import LossConfig
from nemo_opd.config.policy import PolicyConfig
from nemo_opd.config.runtime import CheckpointingConfig, ClusterConfig, LoggerConfig


class DistillationConfig(Section):
    """An on-policy distillation run.

    Validation checks every field, then the cross-field rules in nemo_opd.config.checks.
    Teacher and student must share a tokenizer; that is checked at setup, when the tokenizers
    are loaded, not here.
    """

    policy: PolicyConfig
    """The student: the model that generates rollouts and is trained."""

    teacher: PolicyConfig
    """The frozen teacher that grades every token of the rollouts (same schema as policy;
    optimizer, scheduler and generation are null)."""

    loss_fn: LossConfig = Field(default_factory=LossConfig)
    """The divergence minimized between teacher and student."""

    distillation: DistillationLoopConfig
    """The distillation loop."""

    data: DataConfig
    """The prompts."""

    env: EnvConfig = Field(default_factory=EnvConfig)
    """The environments that grade rollouts."""

    logger: LoggerConfig = Field(default_factory=LoggerConfig)
    """Metrics and rollout logging."""

    cluster: ClusterConfig = Field(default_factory=ClusterConfig)
    """The workers."""

    checkpointing: CheckpointingConfig = Field(default_factory=CheckpointingConfig)
    """Checkpoints of the student."""

    @model_validator(mode="after")
    def _check_consistency(self) -> "DistillationConfig":
        problems = find_problems(self)
        if problems:
            raise ValueError("\n".join(problems))
        return self
