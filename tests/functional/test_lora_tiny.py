"""A LoRA student in the loop: examples/configs/distillation_tiny_lora.yaml, short runs.

- Straight through: vLLM, refit with the merged weights, samples what the student scores (the
  sampler check at fp32 noise); checkpoints hold the adapters and their optimizer state only (a
  fraction of the full model's bytes); final_model is the merged Hugging Face model, equal to
  the base model with the peft adapter of final_model/adapter, and it moved from the base.
- A training worker SIGKILLed mid-run ends the run with one message; the same command resumes
  from the newest checkpoint and logs the uninterrupted run's metrics.
"""

import os
import re
import signal
import sys
from pathlib import Path

import pytest
import run_configs
import torch
from peft import PeftModel
from run_metrics import assert_resumed_like, read_metrics
from run_process import Run, run_to_end
from short_runs import short_run_args
from transformers import AutoModelForCausalLM

from nemo_opd.tiny import resolve_pretrained

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "configs" / "distillation_tiny_lora.yaml"
STEPS = 4
CHECKPOINTS = ("checkpointing.enabled=true", "checkpointing.metric_name=null")


def command(run_dir: Path, *extra: str) -> list[str]:
    script = ROOT / "examples" / "run_distillation_math.py"
    return [sys.executable, str(script), *short_run_args(CONFIG, run_dir, STEPS, *extra)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The uninterrupted run, in this process (the local executor: it starts no process):
    its directory and stdout."""
    run_dir = tmp_path_factory.mktemp("lora_straight")
    args = short_run_args(CONFIG, run_dir, STEPS, *CHECKPOINTS, "checkpointing.save_period=2")
    (output,) = run_configs.run_here([{"args": args}])
    assert output.rstrip().endswith("exit 0 0"), output[-3000:]
    return run_dir, output


def logprobs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)


def test_lora_run_refits_checkpoints_adapters_and_exports_merged(straight):
    run_dir, _ = straight
    metrics = read_metrics(run_dir)
    for step in range(1, STEPS + 1):
        assert metrics[step]["generation/logprob_mismatch"] < 1e-3, metrics[step]

    checkpoint = run_dir / "checkpoints" / "step_2" / "policy"
    assert (checkpoint / "adapter_model.safetensors").exists()
    assert not (checkpoint / "model.safetensors").exists()
    base_dir = Path(resolve_pretrained("tiny:student"))
    base_bytes = (base_dir / "model.safetensors").stat().st_size
    saved_bytes = sum(path.stat().st_size for path in checkpoint.iterdir())
    # rank-16 adapters are 17% of the tiny model's parameters; AdamW keeps two moments of each
    assert saved_bytes < 0.7 * base_bytes, (saved_bytes, base_bytes)

    final = run_dir / "checkpoints" / "final_model"
    merged = AutoModelForCausalLM.from_pretrained(final, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(3, merged.config.vocab_size, (4, 20), generator=generator)
    base_logprobs = logprobs(base, ids)
    adapted = logprobs(PeftModel.from_pretrained(base, str(final / "adapter")), ids)
    merged_logprobs = logprobs(merged, ids)
    assert (merged_logprobs - adapted).abs().max() < 1e-4
    assert (merged_logprobs - base_logprobs).abs().max() > 1e-3  # the adapters trained


@pytest.mark.slow  # two more runs of their own: `pytest -m slow`
def test_sigkill_of_a_training_worker_resumes_like_the_straight_run(straight, tmp_path):
    # On Ray: its training worker is a process of its own to kill (one worker runs locally).
    faulty = command(tmp_path, *CHECKPOINTS, "checkpointing.save_period=1", "cluster.executor=ray")
    run = Run(faulty, tmp_path)
    run.wait_for_checkpoint(2)
    victim = run.policy_workers()[0]
    os.kill(victim, signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 1, err[-3000:]
    assert re.search(rf"worker rank \d died \(pid {victim}", err), err[-3000:]

    out = run_to_end(faulty, tmp_path).stdout
    resumed = re.search(r"resumed from \S+step_(\d+) \(step \d+\)", out)
    assert resumed and int(resumed.group(1)) >= 2, out[-3000:]
    assert_resumed_like(read_metrics(tmp_path), read_metrics(straight[0]), range(1, STEPS + 1))
