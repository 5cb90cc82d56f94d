"""Generation alone, by engine, on the tiny default's shapes: one step's rollouts (32 held-out
prompts x 2 samples, at most 48 new tokens, temperature 1, seeded) and one validation (the 500
held-out prompts, greedy), each engine in a process of its own on the same threads.

Engines: `transformers` (HfWorker, the transformers generation backend), `vllm` (VllmWorker,
as configured by examples/configs/distillation_tiny.yaml), and `generate_batch`
(transformers' own continuous-batching path: a reference for speed only, since it samples
every request from one global generator and cannot give a prompt its own seed).

    uv run --extra cpu python benchmarks/bench_generation.py --threads 1 --repeats 3

Prints, per engine, the fastest of `repeats` timings (after one untimed warm-up of each).
"""

import argparse
import json
import os
import subprocess
import sys
import time

ENGINES = ("transformers", "vllm", "generate_batch")
MAX_NEW_TOKENS = 48
STEP_PROMPTS, SAMPLES = 32, 2


def _prompts() -> tuple[list[list[int]], str, str]:
    """(the 500 held-out prompts' token ids as the loop renders them, model dir, tokenizer
    dir) of the tiny default."""
    from transformers import AutoTokenizer

    from nemo_opd.tiny.assets import resolve_pretrained
    from nemo_opd.tiny.task import load_tiny_math

    model, tokenizer_dir = resolve_pretrained("tiny:student"), resolve_pretrained("tiny:tokenizer")
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": row["prompt"]}],
            add_generation_prompt=True,
            return_dict=True,
        )["input_ids"]
        for row in load_tiny_math("validation")
    ]
    return prompts, model, tokenizer_dir


def _engine(name: str, model: str, tokenizer: str):
    """generate(prompts, sampling, seeds) of the named engine, loaded in fp32."""
    budget = MAX_NEW_TOKENS
    if name == "transformers":
        from nemo_opd.generation.hf_worker import HfWorker

        worker = HfWorker(model, tokenizer, {"precision": "float32", "max_batch_tokens": 65536})
        return lambda ps, sampling, seeds: worker.generate(ps, [budget] * len(ps), sampling, seeds)
    if name == "vllm":
        from nemo_opd.generation.vllm_worker import VllmWorker

        vllm_cfg = {
            "precision": "float32",
            "max_model_len": 128,
            "gpu_memory_utilization": 0.1,
            "kv_cache_memory_bytes": 402653184,
            "enforce_eager": True,
            "tensor_parallel_size": 1,
        }
        worker = VllmWorker(model, tokenizer, vllm_cfg)
        return lambda ps, sampling, seeds: worker.generate(ps, [budget] * len(ps), sampling, seeds)
    return _generate_batch(model, tokenizer)


def _generate_batch(model_dir: str, tokenizer_dir: str):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    eos = AutoTokenizer.from_pretrained(tokenizer_dir).eos_token_id
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    # Its default cache takes a fraction of the host's memory; this one holds the shapes here.
    cache = ContinuousBatchingConfig(
        return_logprobs=True, page_size=16, num_blocks=2048, max_batch_tokens=4096
    )

    def generate(prompts, sampling, seeds):
        sample = sampling["temperature"] > 0
        config = GenerationConfig(
            max_new_tokens=MAX_NEW_TOKENS,
            do_sample=sample,
            temperature=sampling["temperature"] if sample else None,
            top_p=None,
            top_k=None,
            eos_token_id=eos,
            pad_token_id=0,
        )
        return model.generate_batch(
            prompts, generation_config=config, continuous_batching_config=cache
        )

    return generate


def measure(name: str, repeats: int) -> dict:
    """{"engine", "step_s", "validation_s"}: the fastest of `repeats` timings of each."""
    prompts, model, tokenizer = _prompts()
    generate = _engine(name, model, tokenizer)
    step = [p for p in prompts[:STEP_PROMPTS] for _ in range(SAMPLES)]
    sampled = {"temperature": 1.0, "top_p": 1.0, "top_k": None}
    sampled |= {"stop_token_ids": None, "stop_strings": None}
    greedy = {**sampled, "temperature": 0.0}
    seeds = list(range(len(step)))
    generate(step, sampled, seeds)
    generate(prompts, greedy, None)
    timings = {"step_s": [], "validation_s": []}
    for _ in range(repeats):
        started = time.perf_counter()
        generate(step, sampled, seeds)
        timings["step_s"].append(time.perf_counter() - started)
        started = time.perf_counter()
        generate(prompts, greedy, None)
        timings["validation_s"].append(time.perf_counter() - started)
    return {"engine": name, **{key: min(values) for key, values in timings.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engines", nargs="+", choices=ENGINES, default=list(ENGINES))
    parser.add_argument("--threads", type=int, default=1, help="torch / OpenMP threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--one", choices=ENGINES, help=argparse.SUPPRESS)  # a child process
    args = parser.parse_args()
    if args.one:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(measure(args.one, args.repeats)))
        return
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    print(f"{'engine':<16}{'step (64 rollouts)':>20}{'validation (500)':>20}")
    for name in args.engines:
        command = [sys.executable, __file__, "--one", name]
        command += ["--threads", str(args.threads), "--repeats", str(args.repeats)]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
        if done.returncode != 0:
            print(f"{name:<16} failed: {done.stderr.strip().splitlines()[-1:]}")
            continue
        result = json.loads(done.stdout.strip().splitlines()[-1])
        print(f"{name:<16}{result['step_s']:>19.3f}s{result['validation_s']:>19.3f}s")


if __name__ == "__main__":
    main()
