"""The policy tests' shared pieces: tiny random Qwen3 models, float32 policy sections for them,
CPU clusters, policies started in the layout's executor, and batches of ragged rows with a
teacher's top-k. A module of its own name (imported as `tiny_policies`, tests/ being on the
path), not the policy folder's conftest: `conftest` names whichever folder's conftest was
imported last when pytest runs files of several folders in one process."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from transformers import AutoModelForCausalLM, Qwen3Config

from nemo_opd.config import ClusterConfig, PolicyConfig

VOCAB = 256
ODD_VOCAB = 301  # tensor parallelism pads it (to 384 at tp=1, 512 at tp=2: rank 1 is part padding)
SEQ = 24
CHUNK = 7
"""logits_chunk_tokens of the policies under test: several chunks per microbatch, one of them
short (the engines' default, 1024 positions, would take every test microbatch whole)."""


def tiny_qwen3(tied: bool, vocab: int = VOCAB) -> Qwen3Config:
    return Qwen3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        tie_word_embeddings=tied,
        rms_norm_eps=1e-6,
    )


def save_tiny_model(path, tied: bool, seed: int, vocab: int = VOCAB) -> str:
    """A tiny random Qwen3 (tiny_qwen3) saved at `path` with save_pretrained; its LM head
    scaled up so that top-k has clear winners. Returns the directory."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_qwen3(tied, vocab), dtype=torch.float32)
    with torch.no_grad():  # sharpen the random model so top-k has clear winners
        model.lm_head.weight.mul_(8.0) if not tied else model.model.embed_tokens.weight.mul_(8.0)
    model.save_pretrained(path)
    return str(path)


def policy_config(model_dir: str, **overrides) -> PolicyConfig:
    """A float32 policy section for the tiny model; dotted keys in overrides (a__b=...)."""
    raw = {
        "model_name": model_dir,
        "tokenizer": {"name": model_dir},
        "precision": "float32",
        "train_global_batch_size": 4,
        "train_micro_batch_size": 1,
        "logprob_batch_size": 2,
        "max_total_sequence_length": SEQ,
        "max_grad_norm": 1.0,
        "optimizer": {"lr": 1e-3, "weight_decay": 0.01},
        "scheduler": {"warmup_steps": 1},
        "logits_chunk_tokens": CHUNK,
    }
    for key, value in overrides.items():
        node = raw
        *parents, leaf = key.split("__")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return PolicyConfig.model_validate(raw)


def cpu_cluster(workers: int) -> ClusterConfig:
    return ClusterConfig(num_nodes=1, gpus_per_node=workers, device="cpu", cpus_per_worker=1)


def executor_for(workers: int) -> str:
    """Where a test's policy of `workers` ranks runs: one rank in this process (the local
    executor: no process to start), several in processes of this machine forked from a server
    that imported the engines once (the processes executor: torch.distributed needs a process
    per rank, not Ray). test_policy_executors shows both compute bit for bit as Ray workers. A
    test about Ray passes executor="ray" itself."""
    return "local" if workers == 1 else "processes"


def start_policy(cfg: PolicyConfig, workers: int, **kwargs):
    """Policy(cfg, cpu_cluster(workers), executor=executor_for(workers), **kwargs): kwargs are
    Policy's, an `executor` among them overrides the choice."""
    from nemo_opd.policy.policy import Policy

    kwargs.setdefault("executor", executor_for(workers))
    return Policy(cfg, cpu_cluster(workers), **kwargs)


@contextmanager
def running_policy(cfg: PolicyConfig, workers: int, **kwargs) -> Iterator:
    """start_policy(cfg, workers, **kwargs), shut down when the block is left, either way."""
    policy = start_policy(cfg, workers, **kwargs)
    try:
        yield policy
    finally:
        policy.shutdown()


def train_after_resume(
    cfg: PolicyConfig, workers: int, checkpoint: str, batch: dict, loss_fn, *, step: int
) -> dict:
    """Load `checkpoint` into a fresh Policy (checked to be at optimizer step `step`), train one
    call on `batch` and return its metrics; the workers are shut down either way."""
    with running_policy(cfg, workers, name=f"resumed_{cfg.backend}") as resumed:
        resumed.load(checkpoint)
        assert resumed.step == step
        return resumed.train(batch, loss_fn)


def frozen_topk(cfg: PolicyConfig, workers: int, batch: dict, k: int) -> tuple:
    """(values, indices) of get_topk_logits from a fresh frozen Policy (no optimizer), shut
    down afterwards either way."""
    name = f"teacher_{cfg.backend}"
    with running_policy(cfg, workers, optimizer=False, name=name) as teacher:
        return teacher.get_topk_logits(batch, k)


def make_batch(
    num_rows: int, k: int = 4, seed: int = 0, teacher: bool = True, vocab: int = VOCAB
) -> dict:
    """Rows of different lengths (right-padded with id 0), random masks and teacher top-k, with
    ids below `vocab`."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(6, SEQ + 1, (num_rows,), generator=gen)
    lengths[0] = SEQ
    ids = torch.randint(1, vocab, (num_rows, SEQ), generator=gen)
    positions = torch.arange(SEQ)
    valid = positions < lengths.unsqueeze(1)
    ids = torch.where(valid, ids, 0)
    token_mask = (positions >= 3) & valid
    batch = {
        "input_ids": ids,
        "input_lengths": lengths,
        "token_mask": token_mask.float(),
        "sample_mask": torch.ones(num_rows),
    }
    if teacher:
        logits = torch.randn(num_rows, SEQ, vocab, generator=gen) * 3
        values, indices = torch.log_softmax(logits, -1).topk(k, dim=-1)
        batch["teacher_topk_logprobs"] = values
        batch["teacher_topk_indices"] = indices.to(torch.int32)
    return batch
