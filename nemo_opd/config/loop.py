"""The distillation loop: rollout sizes, step counts, top-k, validation cadence."""

from pydantic import Field

from nemo_opd.config.base import Section


class DistillationLoopConfig(Section):
    """How many rollouts each step makes, how long training runs, and when it validates."""

    num_prompts_per_step: int = Field(gt=0)
    """Distinct prompts sampled per step."""

    num_generations_per_prompt: int = Field(1, gt=0)
    """Rollouts per prompt. A step makes num_prompts_per_step x num_generations_per_prompt
    rollouts, which must be a multiple of policy.train_global_batch_size."""

    max_rollout_turns: int = Field(1, ge=1)
    """Most assistant turns per rollout (1 for single-turn math)."""

    max_num_steps: int = Field(gt=0)
    """Training stops after this many steps."""

    max_num_epochs: int = Field(1, gt=0)
    """Training stops after this many passes over the training prompts."""

    topk_logits_k: int = Field(64, ge=1)
    """Teacher log-probs kept per position (its top k); at most the vocabulary size, which is
    checked at setup when the tokenizer is loaded."""

    teacher_temperature: float | None = Field(None, gt=0)
    """Temperature of the teacher's top-k log-probs; null uses loss_fn.temperature (the
    student's), so the two are never silently different."""

    val_period: int = Field(0, ge=0)
    """Validate every val_period steps; 0 disables periodic validation."""

    val_at_start: bool = False
    """Validate before the first step."""

    val_at_end: bool = False
    """Validate after the last step."""

    max_val_samples: int | None = Field(None, gt=0)
    """Validate on at most this many prompts; null uses the whole validation set."""

    val_batch_size: int = Field(64, gt=0)
    """Prompts per validation generation batch."""

    seed: int = Field(42, ge=0)
    """Seed for data order, sampling and initialization."""
