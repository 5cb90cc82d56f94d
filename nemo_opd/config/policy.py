"""The model section shared by the student (`policy`) and the teacher (`teacher`)."""

from typing import Annotated, Literal

from pydantic import Field

from nemo_opd.config.base import Section
from nemo_opd.config.generation import GenerationConfig, Precision
from nemo_opd.config.parallelism import (
    DTensorConfig,
    DynamicBatchingConfig,
    MegatronConfig,
    SequencePackingConfig,
)


class TokenizerConfig(Section):
    """Which tokenizer to load and how to render chats."""

    name: str = Field(min_length=1)
    """Hub name or local path of the tokenizer, or "tiny:tokenizer" for the embedded one;
    usually ${..model_name}."""

    chat_template: str | None = None
    """A Jinja chat template (a file path or the template text); null keeps the tokenizer's own."""


Beta = Annotated[float, Field(ge=0, lt=1)]


class OptimizerConfig(Section):
    """The student's optimizer."""

    name: Literal["adamw"] = "adamw"
    """Optimizer (AdamW, decoupled weight decay)."""

    lr: float = Field(gt=0)
    """Peak learning rate."""

    weight_decay: float = Field(0.01, ge=0)
    """Decoupled weight decay."""

    betas: tuple[Beta, Beta] = (0.9, 0.999)
    """Adam's exponential decay rates for the first and second moments, each in [0, 1)."""

    eps: float = Field(1e-8, gt=0)
    """Added to the denominator for numerical stability."""


class SchedulerConfig(Section):
    """The learning-rate schedule: linear warmup, then constant, cosine or linear decay."""

    name: Literal["constant", "cosine", "linear"] = "constant"
    """Shape of the schedule after warmup."""

    warmup_steps: int = Field(0, ge=0)
    """Optimizer steps of linear warmup from 0 to lr."""

    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    """For cosine and linear: the final learning rate as a fraction of lr."""

    decay_steps: int | None = Field(None, gt=0)
    """For cosine and linear: optimizer steps from the end of warmup to the final learning rate;
    null means until the end of training."""


class PolicyConfig(Section):
    """A model: the student under `policy`, the teacher under `teacher`.

    The teacher is frozen: its optimizer, scheduler and generation are null, and its training
    batch sizes are unused. Whether the teacher's tokenizer matches the student's is checked at
    setup, when both tokenizers are loaded, not when the config is read.
    """

    model_name: str = Field(min_length=1)
    """Hub name or local path of the model, or "tiny:student" / "tiny:teacher" for the embedded
    models (built and cached locally at setup)."""

    tokenizer: TokenizerConfig
    """The tokenizer."""

    precision: Precision = "bfloat16"
    """Parameter and compute dtype."""

    train_global_batch_size: int = Field(32, gt=0)
    """Sequences per optimizer step, across all data-parallel ranks."""

    train_micro_batch_size: int = Field(1, gt=0)
    """Sequences per forward/backward pass on one data-parallel rank."""

    logprob_batch_size: int = Field(1, gt=0)
    """Sequences per forward pass when computing log-probs or top-k logits."""

    generation_batch_size: int = Field(32, gt=0)
    """Prompts per generation call."""

    max_total_sequence_length: int = Field(gt=0)
    """Longest sequence (prompt plus all turns) the model trains or scores on."""

    max_grad_norm: float | None = Field(1.0, gt=0)
    """Clip the global gradient norm to this; null disables clipping."""

    make_sequence_length_divisible_by: int = Field(1, ge=1)
    """Pad each batch's sequence length to a multiple of this (sequence parallel needs a
    multiple of the tensor-parallel size; context parallel is padded for automatically)."""

    dtensor_cfg: DTensorConfig = Field(default_factory=DTensorConfig)
    """The DTensor backend."""

    megatron_cfg: MegatronConfig = Field(default_factory=MegatronConfig)
    """The Megatron backend."""

    sequence_packing: SequencePackingConfig = Field(default_factory=SequencePackingConfig)
    """Sequence packing (exclusive with dynamic_batching)."""

    dynamic_batching: DynamicBatchingConfig = Field(default_factory=DynamicBatchingConfig)
    """Dynamic batching (exclusive with sequence_packing)."""

    optimizer: OptimizerConfig | None = None
    """The optimizer; required for the policy, null for the teacher."""

    scheduler: SchedulerConfig | None = None
    """The learning-rate schedule; null means a constant learning rate (always null for the
    teacher)."""

    generation: GenerationConfig | None = None
    """Rollout generation; required for the policy, null for the teacher."""

    @property
    def backend(self) -> Literal["dtensor", "megatron"]:
        """The enabled training backend (megatron when megatron_cfg.enabled, else dtensor)."""
        return "megatron" if self.megatron_cfg.enabled else "dtensor"

    @property
    def tensor_parallel_size(self) -> int:
        """Tensor-parallel size of the enabled backend."""
        if self.backend == "megatron":
            return self.megatron_cfg.tensor_model_parallel_size
        return self.dtensor_cfg.tensor_parallel_size

    @property
    def context_parallel_size(self) -> int:
        """Context-parallel size of the enabled backend."""
        if self.backend == "megatron":
            return self.megatron_cfg.context_parallel_size
        return self.dtensor_cfg.context_parallel_size

    @property
    def pipeline_parallel_size(self) -> int:
        """Pipeline-parallel size of the enabled backend (always 1 for DTensor)."""
        if self.backend == "megatron":
            return self.megatron_cfg.pipeline_model_parallel_size
        return 1

    @property
    def model_parallel_size(self) -> int:
        """Ranks holding one model replica: tensor x context x pipeline parallel."""
        return self.tensor_parallel_size * self.context_parallel_size * self.pipeline_parallel_size
