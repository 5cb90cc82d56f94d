"""The generation interface the rollout loop talks to (VllmGeneration implements it over vLLM or
transformers engine workers: vllm_generation.py, backends.py), and the contract of one engine
worker."""

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import torch

FinishReason = Literal["stop", "length"]

IN_PLACE = "in place"
"""What a refit is handed where the engine generates from the student's own module
(VllmGeneration.shares_student): the weights are already where it reads them, so nothing is
gathered and nothing copied; the refit records the version."""


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


class EngineWorker(Protocol):
    """One generation engine (one data-parallel replica) holding a copy of the student's
    weights: what VllmGeneration calls on each of its workers, whichever class they are
    (VllmWorker) and whichever executor runs them. Constructed as
    worker_cls(model_path, tokenizer_path, vllm_cfg: dict, seed, sleep_mode)."""

    def ready(self) -> float:
        """Seconds the engine took to start (also a liveness check)."""
        ...

    def startup_marks(self) -> dict[str, float]:
        """This engine's start-up times (nemo_opd.utils.startup)."""
        ...

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        sampling: dict[str, Any],
        seeds: list[int] | None = None,
    ) -> GenerationOutput:
        """One continuation per prompt (see VllmWorker.generate)."""
        ...

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t), t = 1..n-1, of each sequence at temperature 1."""
        ...

    def update_weights(self, weights: dict[str, torch.Tensor]) -> float:
        """Copy full Hugging Face-named tensors into the engine's model; returns seconds."""
        ...

    def sleep(self, level: int = 1) -> None:
        """Release device memory (colocated on GPU); a no-op where unsupported."""
        ...

    def wake_up(self) -> None:
        """Undo sleep()."""
        ...

    def stop(self) -> None:
        """Release the engine now (VllmGeneration.shutdown calls it on engines in its own
        process, where no process exit does): dropped instead, an engine is released at some
        later garbage collection, and vLLM's teardown then ends the process's torch.distributed
        group while other engines of the process may still be using it."""
        ...
