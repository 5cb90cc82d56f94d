"""What a teacher's answer costs to cross from its workers to the driver: every position, or the
trained positions alone (Policy.score's trained_only, policy/trained_positions.py).

    uv run --extra cpu python benchmarks/bench_teacher_transit.py --out runs/bench_transit
    # --executor processes --ranks 2 --hidden 1024 --layers 2 --rows 32 --prompt-len 64
    # --new-tokens 256 --repeats 3

A frozen Policy of --ranks data-parallel CPU ranks (a random Qwen3 of the given width, saved
here) scores --rows rows, each a prompt of --prompt-len tokens and a response of half to all of
--new-tokens (right-padded to the longest), for its final hidden states: the answer of the
full-vocabulary path (loss_fn.support full), H values per position. Asked for hidden states
only, trained_only changes nothing the ranks compute, so the two calls differ only in what
crosses: [B, S, H] from every rank, or [n, H] of the n trained positions from each replica's
answering rank. Each is timed --repeats times after one warm-up call (the median). Writes
OUT/results.json and OUT/results.md.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_executors import policy_section, save_model  # noqa: E402
from harness import run_meta, write_results  # noqa: E402


def rows(count: int, prompt_len: int, new_tokens: int, vocab: int) -> dict:
    """count rows of a prompt and a response of new_tokens // 2 to new_tokens tokens."""
    generator = torch.Generator().manual_seed(0)
    responses = torch.randint(new_tokens // 2, new_tokens + 1, (count,), generator=generator)
    lengths = prompt_len + responses
    seq = int(lengths.max())
    positions = torch.arange(seq)
    valid = positions < lengths.unsqueeze(1)
    ids = torch.randint(1, vocab, (count, seq), generator=generator)
    return {
        "input_ids": torch.where(valid, ids, 0),
        "input_lengths": lengths,
        "token_mask": ((positions >= prompt_len) & valid).float(),
        "sample_mask": torch.ones(count),
    }


def timed(call, repeats: int) -> float:
    call()  # warm-up
    seconds = []
    for _ in range(repeats):
        began = time.perf_counter()
        call()
        seconds.append(time.perf_counter() - began)
    return statistics.median(seconds)


def measure(args, model: str) -> dict:
    from nemo_opd.config import ClusterConfig
    from nemo_opd.policy.policy import Policy
    from nemo_opd.policy.trained_positions import trained_positions

    data = rows(args.rows, args.prompt_len, args.new_tokens, args.vocab)
    cluster = ClusterConfig(num_nodes=1, gpus_per_node=args.ranks, device="cpu", cpus_per_worker=1)
    cfg = policy_section(model, 1, data["input_ids"].shape[1], logprob_batch_size=8)
    policy = Policy(cfg, cluster, optimizer=False, name="teacher", executor=args.executor)
    try:
        answers = {}
        for trained_only in (False, True):
            answers[trained_only] = policy.score(data, hidden=True, trained_only=trained_only)
        where = trained_positions(data["token_mask"])
        expected = answers[False]["hidden_states"] * where.unsqueeze(-1)
        assert torch.equal(answers[True]["hidden_states"], expected), "answers differ"
        result = {}
        for trained_only, name in ((False, "every position"), (True, "trained positions")):
            seconds = timed(
                lambda t=trained_only: policy.score(data, hidden=True, trained_only=t),
                args.repeats,
            )
            result[name] = {"seconds": seconds}
    finally:
        policy.shutdown()
    size = 4 * args.hidden  # float32 bytes per position
    batch, seq = data["input_ids"].shape
    result["every position"]["mib_sent"] = batch * seq * size / 2**20
    result["trained positions"]["mib_sent"] = int(where.sum()) * size / 2**20
    result["shape"] = {"rows": batch, "seq": seq, "trained": int(where.sum())}
    return result


def table(result: dict) -> str:
    lines = ["| the workers send | MiB sent | seconds per call |", "|---|---|---|"]
    for name in ("every position", "trained positions"):
        row = result[name]
        lines.append(f"| {name} | {row['mib_sent']:.1f} | {row['seconds']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("runs/bench_transit"))
    parser.add_argument("--executor", default="processes", choices=["processes", "ray", "local"])
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--prompt-len", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        positions = args.prompt_len + args.new_tokens
        model = save_model(Path(folder) / "model", args.hidden, args.layers, args.vocab, positions)
        print(f"{args.executor}: {args.rows} rows on {args.ranks} ranks", flush=True)
        if args.executor == "ray":
            from nemo_opd.config import ClusterConfig
            from nemo_opd.distributed.ray_runtime import ray_session

            cluster = ClusterConfig(num_nodes=1, gpus_per_node=args.ranks, device="cpu")
            with ray_session(cluster):
                result = measure(args, model)
        else:
            result = measure(args, model)
    meta = {**run_meta(), **{k: str(v) for k, v in vars(args).items()}}
    write_results(args.out, {"meta": meta, "result": result}, table(result))


if __name__ == "__main__":
    main()
