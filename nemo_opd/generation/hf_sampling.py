"""Sampling for the transformers backend: vLLM's distribution, one random stream per row.

The distribution a row samples from is the one vLLM samples from (and reports log-probs of,
with logprobs_mode="processed_logprobs", see vllm_worker.py): logits / temperature, then top-k,
then top-p, the kept tokens renormalized. The filtering is transformers' own logits warpers
(TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper), which compute the same masks as
vLLM: top-k keeps every logit at least the k-th largest, top-p drops the tokens whose ascending
cumulative probability stays within 1 - top_p, never the most likely one. Greedy decoding applies
no temperature: it takes the argmax and reports log_softmax(logits) (temperature 1).

Seeds: each row draws from a torch.Generator of its own, seeded with its request's seed, and
draws one number at every step it is sampled. So a row's tokens depend on its prompt and seed
only, not on the rows beside it, their number or their order (up to the floating-point rounding
of a batched forward). The draw inverts the row's cumulative distribution (float64) at a uniform
number: the token i with cdf[i - 1] <= u * cdf[-1] < cdf[i] is drawn with probability p[i], and
a token of probability 0 (filtered out) has an empty interval, so it is never drawn (nor is one
below float64's resolution of the running sum, 2**-53 of it). One number per row per step: the
exponential race, one exponential per vocabulary entry, cost most of a decode step's time at a
real vocabulary on a CPU (docs/generation.md).
"""

from typing import Any

import torch
from transformers import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)


def is_greedy(sampling: dict[str, Any]) -> bool:
    """Whether `sampling` (VllmGeneration._sampling's dict) asks for argmax decoding."""
    return sampling["temperature"] == 0


def logits_warpers(sampling: dict[str, Any]) -> LogitsProcessorList:
    """Temperature, then top-k (None = off), then top-p (1 = off), as vLLM applies them;
    empty for greedy decoding."""
    warpers = LogitsProcessorList()
    if is_greedy(sampling):
        return warpers
    warpers.append(TemperatureLogitsWarper(sampling["temperature"]))
    if sampling.get("top_k"):
        warpers.append(TopKLogitsWarper(sampling["top_k"]))
    if sampling.get("top_p", 1.0) < 1.0:
        warpers.append(TopPLogitsWarper(sampling["top_p"]))
    return warpers


def processed_logprobs(logits: torch.Tensor, warpers: LogitsProcessorList) -> torch.Tensor:
    """[B, V] fp32 log-probs of the distribution each row samples from (-inf where filtered
    out), from [B, V] next-token logits of any dtype."""
    # The warpers ignore input_ids (they read the scores only).
    return torch.log_softmax(warpers(None, logits.float()), dim=-1)


def row_generators(seeds: list[int], device: torch.device) -> list[torch.Generator]:
    """One generator per row on `device`, seeded with the row's seed (taken modulo 2**64: a
    CPU generator reads the low 32 bits of it, a CUDA one all 64)."""
    return [torch.Generator(device=device).manual_seed(seed % 2**64) for seed in seeds]


def sample(logprobs: torch.Tensor, generators: list[torch.Generator] | None) -> torch.Tensor:
    """[B] token ids from [B, V] processed log-probs: the argmax when `generators` is None
    (greedy), else row b drawn with one uniform number of generators[b] (inverse CDF)."""
    if generators is None:
        return logprobs.argmax(dim=-1)
    if len(generators) != len(logprobs):
        raise ValueError(f"{len(generators)} generators for {len(logprobs)} rows: one per row")
    cdf = logprobs.double().exp().cumsum(dim=-1)  # [B, V]; flat where a token is filtered out
    total = cdf[:, -1:]
    uniforms = torch.stack(
        [torch.rand((), generator=g, dtype=torch.float64, device=g.device) for g in generators]
    ).to(cdf.device)
    # Below the total even where u * total rounds up to it: the drawn interval is never empty.
    targets = torch.minimum(uniforms.unsqueeze(-1) * total, total.nextafter(total.new_zeros(())))
    return torch.searchsorted(cdf, targets, right=True).squeeze(-1)
