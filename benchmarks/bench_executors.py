"""How long a policy of several ranks takes to start, and to answer a call, on each executor
that runs ranks as processes: Ray's actors and the processes executor's forked processes.

    uv run --extra cpu python benchmarks/bench_executors.py --out runs/bench_executors
    # --ranks 2 --tp 2 --repeats 5 --hidden 64 --layers 2 --executors processes ray

Each repeat starts a Policy of --ranks CPU ranks (tensor parallel --tp, the rest data
parallel) of a random Qwen3 of the given width saved here, waits until every rank has built its
engine ("start"), scores a batch of 8 rows of 64 tokens with get_logprobs ("call"), and shuts
it down ("stop"). The first repeat of each executor is reported apart: it includes Ray's
start of its local instance, or the fork server's imports of torch, transformers and the
engines (once per driver process); the later repeats are the cost of every further model's
start. Writes OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import run_meta, write_results  # noqa: E402


def save_model(path: Path, hidden: int, layers: int, vocab: int, positions: int = 256) -> str:
    """A random Qwen3 of the given width and depth (and context: positions), saved at
    `path`."""
    from transformers import AutoModelForCausalLM, Qwen3Config

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=positions,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.float32).save_pretrained(path)
    return str(path)


def policy_section(model: str, tp: int, seq: int = 64, logprob_batch_size: int = 4):
    """The policy section of a float32 model at `model` on tp ranks per replica, for rows of
    up to `seq` tokens scored logprob_batch_size at a time."""
    from nemo_opd.config import PolicyConfig

    return PolicyConfig.model_validate(
        {
            "model_name": model,
            "tokenizer": {"name": model},
            "precision": "float32",
            "train_global_batch_size": 8,
            "train_micro_batch_size": 2,
            "logprob_batch_size": logprob_batch_size,
            "max_total_sequence_length": seq,
            "dtensor_cfg": {"tensor_parallel_size": tp},
        }
    )


def batch(vocab: int) -> dict:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, vocab, (8, 64), generator=generator)
    return {"input_ids": ids, "input_lengths": torch.full((8,), 64)}


def one_start(executor: str, cfg, cluster, data: dict) -> dict[str, float]:
    """Start, call and stop one Policy: seconds of each."""
    from nemo_opd.policy.policy import Policy

    began = time.perf_counter()
    policy = Policy(cfg, cluster, optimizer=False, name=executor, executor=executor)
    started = time.perf_counter()
    policy.get_logprobs(data)
    called = time.perf_counter()
    policy.shutdown()
    stopped = time.perf_counter()
    return {
        "start_s": started - began,
        "call_s": called - started,
        "stop_s": stopped - called,
    }


def run_executor(executor: str, args, cfg, cluster, data) -> list[dict[str, float]]:
    if executor == "ray":
        # as the command line: under `uv run`, Ray would build a fresh environment per worker
        os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
        from nemo_opd.distributed.ray_runtime import ray_session

        with ray_session(cluster):
            return [one_start(executor, cfg, cluster, data) for _ in range(args.repeats)]
    return [one_start(executor, cfg, cluster, data) for _ in range(args.repeats)]


def table(results: dict[str, list[dict[str, float]]]) -> str:
    lines = [
        "| executor | first start s | later starts s (median) | call s | stop s |",
        "|---|---|---|---|---|",
    ]
    for executor, runs in results.items():
        later = runs[1:] or runs
        lines.append(
            f"| {executor} | {runs[0]['start_s']:.2f} | "
            f"{statistics.median(r['start_s'] for r in later):.2f} | "
            f"{statistics.median(r['call_s'] for r in later):.3f} | "
            f"{statistics.median(r['stop_s'] for r in later):.2f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_executors"))
    parser.add_argument("--executors", nargs="+", default=["processes", "ray"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--tp", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=256)
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error("--repeats must be at least 2 (the first start is reported apart)")

    from nemo_opd.config import ClusterConfig

    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        model = save_model(Path(folder) / "model", args.hidden, args.layers, args.vocab)
        cfg = policy_section(model, args.tp)
        cluster = ClusterConfig(
            num_nodes=1, gpus_per_node=args.ranks, device="cpu", cpus_per_worker=1
        )
        data = batch(args.vocab)
        results = {}
        for executor in args.executors:
            print(f"{executor}: {args.repeats} starts of {args.ranks} ranks", flush=True)
            results[executor] = run_executor(executor, args, cfg, cluster, data)
    meta = {**run_meta(), **{k: str(v) for k, v in vars(args).items()}}
    write_results(args.out, {"meta": meta, "runs": results}, table(results))


if __name__ == "__main__":
    main()
