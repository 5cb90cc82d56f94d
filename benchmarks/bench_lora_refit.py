"""Refit of a LoRA student into vLLM, both ways, on the tiny task.

    merged   the adapters folded into the base weights (lora.merged_weight) and every weight
             copied into the running engine (VllmWorker.update_weights): what the loop does
    adapter  the adapter written in peft's format (lora.save_adapter) and loaded by vLLM's own
             LoRA support (enable_lora, one LoRARequest per step, as each step's weights differ)

Each step refits a fresh adapter of the tiny student (rank 16 on all seven projections, B
random) and samples the loop's rollouts (32 prompts x 2, 48 new tokens, temperature 1, seeded).
Each mode runs in a process of its own (one engine each); a third check decodes 64 prompts
greedily after the same adapter in both modes and reports how many token sequences agree.

    uv run --extra cpu python benchmarks/bench_lora_refit.py [--steps 10] [--out FILE]

Measures only the engine side: the loop also gathers the weights from the trainer (the merged
path gathers every weight, the adapter path would gather the adapters only).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

RANK, ALPHA = 16, 32.0
PROMPTS, SAMPLES, NEW_TOKENS = 32, 2, 48


def adapter_state(student: Path, step: int) -> tuple[dict, dict]:
    """({peft key: tensor}, {HF name: merged weight}) of a random adapter of the student."""
    from transformers import AutoModelForCausalLM

    from nemo_opd.config import LoraConfig
    from nemo_opd.policy.engines.lora import (
        adapter_pairs,
        inject_lora,
        is_adapter,
        merge_state,
        peft_name,
    )

    model = AutoModelForCausalLM.from_pretrained(student, dtype=torch.float32)
    inject_lora(model, LoraConfig(enabled=True, rank=RANK, alpha=ALPHA, init_seed=step))
    generator = torch.Generator().manual_seed(1000 + step)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if ".lora_B." in name:
                param.copy_(0.02 * torch.randn(param.shape, generator=generator))
    state = {name: param.detach() for name, param in params.items()}
    adapters = {peft_name(n): tensor for n, tensor in state.items() if is_adapter(n)}
    merged = merge_state(state, adapter_pairs(model))
    merged.setdefault("lm_head.weight", merged["model.embed_tokens.weight"])
    return adapters, merged


def engine(student: Path, tokenizer: Path, lora: bool):
    from nemo_opd.generation.vllm_worker import (
        cpu_scheduler_args,
        quiet_vllm_logs,
        set_engine_env,
        vllm_tokenizer_source,
    )

    set_engine_env()
    quiet_vllm_logs()
    from vllm import LLM

    extra = {"enable_lora": True, "max_lora_rank": RANK, "max_loras": 1} if lora else {}
    return LLM(
        **cpu_scheduler_args("cpu", 128),
        model=str(student),
        tokenizer=vllm_tokenizer_source(str(tokenizer), str(student)),
        dtype="float32",
        max_model_len=128,
        kv_cache_memory_bytes=402653184,
        enforce_eager=True,
        distributed_executor_backend="uni",
        seed=0,
        **extra,
    )


def run_mode(mode: str, steps: int) -> dict:
    """Per-step refit and generation seconds of one mode, and its greedy decodes."""
    from nemo_opd.config import LoraConfig
    from nemo_opd.policy.engines.lora import save_adapter
    from nemo_opd.tiny.assets import ensure_tiny_assets
    from nemo_opd.tiny.task import load_jsonl

    assets = ensure_tiny_assets()
    prompts = [r["prompt"] for r in load_jsonl(assets.validation_file)]
    llm = engine(assets.student, assets.tokenizer, lora=mode == "adapter")
    from vllm import SamplingParams  # after engine(), which sets vLLM's environment first
    from vllm.lora.request import LoRARequest

    cfg = LoraConfig(enabled=True, rank=RANK, alpha=ALPHA)
    sampling = SamplingParams(n=SAMPLES, temperature=1.0, max_tokens=NEW_TOKENS, seed=7)
    greedy = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
    refit, generation = [], []
    with tempfile.TemporaryDirectory() as tmp:

        def apply(step: int):
            """Refit this step's adapter; the LoRARequest to sample with (adapter mode)."""
            adapters, merged = adapter_state(assets.student, step)
            started = time.perf_counter()
            if mode == "merged":
                llm.collective_rpc(
                    "reload_weights", kwargs={"weights_iterator": iter(merged.items())}
                )
                llm.reset_prefix_cache()
                request = None
            else:
                path = Path(tmp) / f"step_{step}"
                save_adapter(path, adapters, cfg, str(assets.student))
                request = LoRARequest(f"step_{step}", step + 1, str(path))
            return request, time.perf_counter() - started

        for step in range(steps + 1):  # step 0 warms up and is not counted
            request, seconds = apply(step)
            batch = prompts[step * PROMPTS : (step + 1) * PROMPTS]
            started = time.perf_counter()
            llm.generate(batch, sampling, lora_request=request, use_tqdm=False)
            if step:
                refit.append(seconds)
                generation.append(time.perf_counter() - started)
        request, _ = apply(steps + 1)
        outputs = llm.generate(prompts[:64], greedy, lora_request=request, use_tqdm=False)
    return {
        "refit_s": statistics.median(refit),
        "generation_s": statistics.median(generation),
        "greedy": [list(o.outputs[0].token_ids) for o in outputs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--mode", choices=("merged", "adapter"), help=argparse.SUPPRESS)
    parser.add_argument("--out", default="runs/bench_lora_refit.json")
    args = parser.parse_args()
    if args.mode:  # a child: one engine, its result as JSON on the last line
        print(json.dumps(run_mode(args.mode, args.steps)))
        return

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from harness import run_meta

    results = {}
    for mode in ("merged", "adapter"):
        command = [sys.executable, __file__, "--mode", mode, "--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode:
            results[mode] = {"error": done.stderr.strip().splitlines()[-1]}
            print(f"{mode}: failed: {results[mode]['error']}")
            continue
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
        print(
            f"{mode:8s} refit {1000 * results[mode]['refit_s']:7.1f} ms   "
            f"generation {1000 * results[mode]['generation_s']:7.1f} ms   (median of {args.steps})"
        )
    if all("greedy" in result for result in results.values()):
        pairs = zip(results["merged"]["greedy"], results["adapter"]["greedy"], strict=True)
        same = sum(a == b for a, b in pairs)
        print(f"greedy decodes that agree: {same} of {len(results['merged']['greedy'])}")
        results["greedy_agree"] = same
    for result in results.values():
        if isinstance(result, dict):
            result.pop("greedy", None)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"meta": run_meta(), "results": results}, indent=2))
    print(f"written {args.out}")


if __name__ == "__main__":
    main()
