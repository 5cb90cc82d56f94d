"""Train a config in this process, export the final student, and score probe sequences with the
student the run ends with: the run's own log-probs, for a test to compare an export against.

    record = train_export_score(CONFIG, overrides)

record: {"input_ids": [B, S], "input_lengths": [B], "logprobs": [B, S] (position t scores
token t + 1), "final_model": the export's folder}. The probes are the first validation prompts
rendered with the run's chat template, each followed by its reference answer.
"""

import contextlib
import os

import torch

from nemo_opd.config import load_config
from nemo_opd.config.executor import run_executor, uses_ray

PROBES = 4


def probe_batch(state) -> dict[str, torch.Tensor]:
    """The first PROBES validation prompts, each with its answer as the assistant's turn."""
    tokenizer = state.formatter.tokenizer
    rows = []
    for sample in state.val_prompts.samples[:PROBES]:
        meta = sample["metadata"]
        chat = [
            {"role": "user", "content": meta["prompt"]},
            {"role": "assistant", "content": str(meta["answer"])},
        ]
        rendered = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True)
        rows.append(list(rendered["input_ids"]))
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row)] = torch.tensor(row)
    lengths = torch.tensor([len(row) for row in rows])
    mask = (torch.arange(width)[None, :] < lengths[:, None]).long()
    return {
        "input_ids": ids,
        "input_lengths": lengths,
        "token_mask": mask,
        "sample_mask": torch.ones(len(rows)),
    }


def executor_session(cfg):
    """A Ray session for a run on Ray; nothing for one without Ray (the local and processes
    executors), as the command line does (nemo_opd.cli)."""
    if not uses_ray(run_executor(cfg)):
        return contextlib.nullcontext()
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from nemo_opd.distributed.ray_runtime import ray_session

    return ray_session(cfg.cluster)


def train_export_score(config: str, overrides: list[str] | None = None) -> dict:
    """Train `config` (with `overrides`) in this process, export the final student and score
    the probes with it: the record (module docstring)."""
    from nemo_opd.algorithms.distillation import distillation_train, export_final_model
    from nemo_opd.algorithms.setup import setup

    cfg = load_config(config, overrides or [])
    with executor_session(cfg):
        state = setup(cfg)
        try:
            assert distillation_train(state)
            final = export_final_model(state)
            batch = probe_batch(state)
            logprobs = state.student.get_logprobs(batch)
        finally:
            state.shutdown()
    return {**batch, "logprobs": logprobs, "final_model": str(final)}
