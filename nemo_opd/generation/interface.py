"""The generation interface the rollout loop talks to; VllmGeneration implements it over vLLM or
transformers engines (vllm_generation.py, backends.py)."""

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

FinishReason = Literal["stop", "length"]


@dataclass
class GenerationOutput:
    """What one generate() call produced, one entry per prompt, in prompt order.

    token_ids[i]: the generated ids of prompt i (prompt excluded; the stop token included when
        generation stopped on one).
    logprobs[i]: log-prob of each generated id under the engine's model at the sampling
        temperature, same length as token_ids[i].
    finish_reasons[i]: "stop" (EOS, a stop token or a stop string) or "length" (max_new_tokens).
    """

    token_ids: list[list[int]]
    logprobs: list[list[float]]
    finish_reasons: list[FinishReason]
    metrics: dict[str, float] = field(default_factory=dict)


class GenerationInterface(Protocol):
    """A generation engine holding a copy of the student's weights."""

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: list[int] | int | None = None,
        greedy: bool = False,
        seed: int | list[int] | None = None,
        temperature: float | None = None,
    ) -> GenerationOutput:
        """Sample one continuation per prompt (token ids). max_new_tokens may differ per prompt
        (the rollout shrinks it so a sequence never exceeds max_seq_len); seed is a base seed
        (prompt i samples with request_seed(seed, i, 0): nemo_opd.utils.seeds), one seed per
        prompt, or None (the engine's RNG); temperature overrides the engine's configured
        sampling temperature for this call (None keeps it)."""
        ...

    def refit(self, weights: dict[str, torch.Tensor] | Any, version: int) -> bool:
        """Load `weights` (full tensors, Hugging Face names, or an engine-specific handle on
        them such as a Ray ObjectRef) unless `version` is already loaded. Returns whether
        weights were pushed."""
        ...

    def prepare_for_generation(self) -> None:
        """Wake the engine (colocated on GPU: reclaim memory released by finish_generation)."""
        ...

    def finish_generation(self) -> None:
        """Release memory for training (colocated on GPU: sleep); no-op where unsupported."""
        ...

    def shutdown(self) -> None:
        """Stop the engine's workers."""
        ...
