"""Load a model folder in vLLM (the CPU build here) as a user would, straight from disk, and
score sequences: log p(token t + 1 | tokens <= t) at every position.

    vllm_logprobs(MODEL_DIR, probes, PRECISION)

probes holds "input_ids" [B, S] and "input_lengths" [B]; the answer is [B, S] log-probs aligned
like Policy.get_logprobs (0 past each row's last scored position).
"""

import torch

from nemo_opd.generation.vllm_worker import VllmWorker


def vllm_logprobs(model: str, probes: dict, precision: str) -> torch.Tensor:
    """[B, S] log-probs of probes' rows (input_ids [B, S], input_lengths [B]) from an engine
    of `model` loaded from disk, stopped afterwards."""
    rows = [
        ids[:length].tolist()
        for ids, length in zip(probes["input_ids"], probes["input_lengths"], strict=True)
    ]
    engine = VllmWorker(
        model,
        model,
        {
            "precision": precision,
            "max_model_len": max(map(len, rows)) + 8,
            "gpu_memory_utilization": 0.1,
            "kv_cache_memory_bytes": 64 << 20,
            "enforce_eager": True,
        },
    )
    try:
        scores = engine.score(rows)
    finally:
        engine.stop()
    logprobs = torch.zeros(probes["input_ids"].shape)
    for index, row in enumerate(scores):
        logprobs[index, : len(row)] = torch.tensor(row)
    return logprobs
