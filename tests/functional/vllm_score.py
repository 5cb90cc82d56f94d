"""Load a model folder in vLLM (the CPU build here) as a user would, straight from disk, and
score sequences: log p(token t + 1 | tokens <= t) at every position.

    python vllm_score.py MODEL_DIR IDS.pt OUT.pt PRECISION

IDS.pt holds "input_ids" [B, S] and "input_lengths" [B]; OUT.pt gets "logprobs" [B, S] aligned
like Policy.get_logprobs (0 past each row's last scored position).
"""

import sys

import torch

from nemo_opd.generation.vllm_worker import VllmWorker

if __name__ == "__main__":
    model, ids_file, out_file, precision = sys.argv[1:5]
    probes = torch.load(ids_file)
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
    scores = engine.score(rows)
    logprobs = torch.zeros(probes["input_ids"].shape)
    for index, row in enumerate(scores):
        logprobs[index, : len(row)] = torch.tensor(row)
    torch.save({"logprobs": logprobs}, out_file)
