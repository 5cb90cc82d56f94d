"""Training backends (DTensor, Megatron) and how microbatches are formed (packing, dynamic)."""

from typing import Literal

from pydantic import Field

from nemo_opd.config.base import Section


class DTensorConfig(Section):
    """The DTensor backend: FSDP2 over data parallel, plus tensor and context parallel."""

    enabled: bool = True
    """Use the DTensor backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""

    tensor_parallel_size: int = Field(1, ge=1)
    """Tensor-parallel ranks per model replica (the vocab dimension of the logits is split too)."""

    context_parallel_size: int = Field(1, ge=1)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""

    sequence_parallel: bool = False
    """Shard activations outside attention and MLP along the sequence over the tensor-parallel
    ranks."""

    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""

    cpu_offload: bool = False
    """Keep parameters, gradients and optimizer state in host memory between uses."""


class MegatronConfig(Section):
    """The Megatron-core backend: tensor, pipeline, context and expert parallel."""

    enabled: bool = False
    """Use the Megatron backend. Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled."""

    tensor_model_parallel_size: int = Field(1, ge=1)
    """Tensor-parallel ranks per model replica."""

    pipeline_model_parallel_size: int = Field(1, ge=1)
    """Pipeline stages per model replica."""

    context_parallel_size: int = Field(1, ge=1)
    """Context-parallel ranks: each holds a slice of every sequence's tokens."""

    expert_model_parallel_size: int = Field(1, ge=1)
    """Expert-parallel ranks for mixture-of-experts layers (1 for dense models)."""

    sequence_parallel: bool = False
    """Shard activations outside attention and MLP along the sequence over the tensor-parallel
    ranks."""

    activation_checkpointing: bool = False
    """Recompute activations in the backward pass instead of storing them."""

    distributed_optimizer: bool = False
    """Shard optimizer state across data-parallel ranks (Megatron's distributed optimizer). Not
    supported yet: the Megatron engine keeps AdamW state replicated over data-parallel ranks."""

    converted_checkpoint_dir: str | None = None
    """Where HF checkpoints converted to Megatron format are cached; null uses a directory
    under the checkpoint directory."""


class SequencePackingConfig(Section):
    """Sequence packing: several sequences share one row, separated by cu_seqlens boundaries."""

    enabled: bool = False
    """Pack sequences into rows of up to train_mb_tokens / logprob_mb_tokens tokens."""

    train_mb_tokens: int | None = Field(None, gt=0)
    """Tokens per packed training microbatch; required when enabled and at least
    max_total_sequence_length, so that any single sequence fits."""

    logprob_mb_tokens: int | None = Field(None, gt=0)
    """Tokens per packed microbatch for log-prob and top-k passes; required when enabled and at
    least max_total_sequence_length."""

    algorithm: Literal[
        "concatenative",
        "first_fit_decreasing",
        "first_fit_shuffle",
        "modified_first_fit_decreasing",
    ] = "modified_first_fit_decreasing"
    """Bin-packing algorithm that assigns sequences to rows."""

    sequence_length_round: int = Field(64, ge=1)
    """Each packed sequence's length is rounded up to a multiple of this."""


class DynamicBatchingConfig(Section):
    """Dynamic batching: microbatches of variable size chosen to hold about N tokens each."""

    enabled: bool = False
    """Group sequences of similar length into microbatches bounded by a token budget."""

    train_mb_tokens: int | None = Field(None, gt=0)
    """Token budget per training microbatch; required when enabled and at least
    max_total_sequence_length."""

    logprob_mb_tokens: int | None = Field(None, gt=0)
    """Token budget per log-prob / top-k microbatch; required when enabled and at least
    max_total_sequence_length."""

    sequence_length_round: int = Field(64, ge=1)
    """Padded sequence lengths are rounded up to a multiple of this."""
