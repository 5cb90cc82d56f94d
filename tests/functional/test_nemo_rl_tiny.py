"""A NeMo-RL user's first day, on the tiny models: their config converts, runs, exports and
evaluates.

1. NeMo-RL's own examples/configs/distillation_math.yaml (or, without NeMo-RL's repository on
   the machine, the one written here in its format) converts with python -m nemo_opd.convert;
   a file that inherits the converted one and points it at the tiny ("micro") models runs a step
   of training in bf16, validates and exports the final student.
2. The export is bf16 Hugging Face weights with config, tokenizer, chat template and
   generation_config.json and no training state; transformers and vLLM (its CPU build) load
   it from disk and give the run's own log-probs of the probe sequences (scored by the
   run's student before it shut down), closer than the student the run started from.
3. python -m nemo_opd.evaluate on the step's checkpoint: exit 0, greedy accuracy, avg@2 and
   pass@2, the teacher's divergences, and a JSONL with every graded response.

Each part runs in the test's process, as its command's main() would (one worker: the local
executor), sharing the process's imports.
"""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
import yaml
from nemo_rl_configs import FIXTURES, nemo_rl_repo, published_configs
from run_and_score import train_export_score
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from vllm_score import vllm_logprobs

from nemo_opd.convert.__main__ import main as convert
from nemo_opd.evaluate import main as evaluate
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe

pytest.importorskip("vllm")

VAL_PROMPTS = 6
SAMPLES = 2
# bf16 rounds each weight and activation to 8 bits of mantissa: the run (FSDP's bf16 compute
# over fp32 master weights), transformers and vLLM each round in their own order.
MEAN_ATOL = 0.03


def tiny_overlay(converted: Path, assets, run_dir: Path) -> dict:
    """What a user changes in the converted config to run it on the micro models here."""
    model = {
        "tokenizer": {"name": str(assets.tokenizer), "chat_template": None},
        "precision": "bfloat16",
        "logprob_batch_size": 16,
        "max_total_sequence_length": 128,
        "make_sequence_length_divisible_by": 1,
        "dtensor_cfg": {
            "enabled": True,
            "tensor_parallel_size": 1,
            "context_parallel_size": 1,
            "activation_checkpointing": False,
        },
        "megatron_cfg": {"enabled": False},
        "dynamic_batching": {"enabled": False},
        "sequence_packing": {"enabled": False},
    }
    return {
        "defaults": str(converted),
        "policy": {
            **model,
            "model_name": str(assets.student),
            "train_global_batch_size": 16,
            "train_micro_batch_size": 8,
            "optimizer": {"lr": 5.0e-3},  # one step that moves the student clearly
            "generation": {
                "max_new_tokens": 16,
                "vllm_cfg": {"kv_cache_memory_bytes": 64 << 20, "enforce_eager": True},
            },
        },
        "teacher": {**model, "model_name": str(assets.teacher)},
        "data": {
            "dataset_name": None,
            "val_dataset_name": None,
            "val_split": None,
            "train_path": str(assets.train_file),
            "val_path": str(assets.validation_file),
            "prompt_key": "prompt",
            "answer_key": "answer",
            "prompt_file": None,
            "max_input_seq_length": 64,
        },
        "distillation": {
            "num_prompts_per_step": 8,
            "num_generations_per_prompt": 2,
            "max_num_steps": 1,
            "topk_logits_k": 8,
            "val_period": 1,
            "max_val_samples": VAL_PROMPTS,
            "val_batch_size": 12,
            "val_samples_per_prompt": SAMPLES,
        },
        "checkpointing": {
            "checkpoint_dir": str(run_dir / "checkpoints"),
            "save_period": 1,
            "metric_name": f"validation/accuracy_avg@{SAMPLES}",
        },
        "logger": {
            "log_dir": str(run_dir / "logs"),
            "wandb_enabled": False,
            "tensorboard_enabled": False,
            "console_progress": False,
        },
        "env": {"math": {"num_workers": 1, "timeout_s": 5.0}},
        "cluster": {"num_nodes": 1, "gpus_per_node": 1, "device": "cpu", "cpus_per_worker": 2},
    }


def nemo_rl_config(root: Path) -> Path:
    """NeMo-RL's published DTensor config when its repository is here, else ours in its format."""
    if nemo_rl_repo() is None:
        print("NeMo-RL's repository is absent: converting tests/fixtures/nemo_rl's config")
        return FIXTURES / "examples" / "configs" / "distillation_math.yaml"
    return next(p for p in published_configs(root) if p.name == "distillation_math.yaml")


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    """Convert, point at the micro models, run one step (with validation), export; returns the
    paths and the run's own log-probs of the probes."""
    assets = ensure_tiny_assets(micro_recipe())
    run_dir = tmp_path_factory.mktemp("nemo_rl_run")
    converted = run_dir / "converted.yaml"
    assert convert(["nemo-rl", str(nemo_rl_config(run_dir / "nemo_rl")), "-o", str(converted)]) == 0
    config = run_dir / "tiny.yaml"
    config.write_text(yaml.safe_dump(tiny_overlay(converted, assets, run_dir), sort_keys=False))
    with contextlib.redirect_stdout(io.StringIO()):
        scored = train_export_score(str(config))
    return {"dir": run_dir, "config": config, "scored": scored, "assets": assets}


def test_the_export_is_what_users_load(run):
    scored = run["scored"]
    final = Path(scored["final_model"])
    files = {path.name for path in final.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= files
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= files
    assert not {"training_state.pt", "nemo_opd.json"} & files
    assert {t.dtype for t in load_file(final / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((final / "config.json").read_text())["dtype"] == "bfloat16"

    ids, lengths, own = scored["input_ids"], scored["input_lengths"], scored["logprobs"]
    model = AutoModelForCausalLM.from_pretrained(final)
    assert model.dtype == torch.bfloat16
    initial = AutoModelForCausalLM.from_pretrained(run["assets"].student, dtype=torch.bfloat16)
    error = mean_error(hf_logprobs(model, ids), own, lengths)
    before = mean_error(hf_logprobs(initial, ids), own, lengths)
    print(f"\ntransformers vs the run: {error:.4f} (the initial student: {before:.4f})")
    assert error < MEAN_ATOL and error < before / 2, (error, before)

    with contextlib.redirect_stdout(io.StringIO()):
        from_vllm = vllm_logprobs(str(final), scored, "bfloat16")
    error = mean_error(from_vllm, own, lengths)
    print(f"vLLM vs the run: {error:.4f}")
    assert error < MEAN_ATOL and error < before / 2, (error, before)


def hf_logprobs(model, ids: torch.Tensor) -> torch.Tensor:
    """[B, S] log p(token t + 1 | tokens <= t) at position t (the last position 0)."""
    with torch.no_grad():
        logits = model(ids).logits.float()
    picked = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]
    return torch.cat([picked, torch.zeros(len(ids), 1)], dim=1)


def mean_error(ours: torch.Tensor, theirs: torch.Tensor, lengths: torch.Tensor) -> float:
    """Mean |difference| over every scored position (t < length - 1)."""
    width = ours.shape[1]
    mask = torch.arange(width)[None, :] < (lengths[:, None] - 1)
    return float((ours - theirs).abs()[mask].mean())


def test_evaluate_a_checkpoint(run):
    out = run["dir"] / "evaluation"
    args = ["--config", str(run["config"])]  # python -m nemo_opd.evaluate's, in this process
    args += ["--checkpoint", str(run["dir"] / "checkpoints" / "step_1")]
    args += ["--samples", str(SAMPLES), "--output-dir", str(out)]
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert evaluate(args) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    for name in (
        "validation/accuracy",
        f"validation/accuracy_avg@{SAMPLES}",
        f"validation/pass@{SAMPLES}",
        "validation/forward_kl",
        "validation/reverse_kl",
    ):
        assert name in metrics and name in printed.getvalue(), name
    graded = [json.loads(line) for line in (out / "graded.jsonl").read_text().splitlines()]
    assert all({"prompt", "response", "answer", "reward"} <= set(r) for r in graded)
    prompts = sorted(r["prompt"] for r in graded if r["mode"] == "greedy")
    print(f"\n{len(prompts)} validation prompts, {len(graded)} graded responses")
    assert 0 < len(prompts) <= VAL_PROMPTS and len(set(prompts)) == len(prompts)
    for sample in range(SAMPLES):  # each prompt once greedy, then once per sample
        drawn = sorted(
            r["prompt"] for r in graded if (r["mode"], r["sample"]) == ("sampled", sample)
        )
        assert drawn == prompts, sample
    assert len(graded) == len(prompts) * (1 + SAMPLES)
    greedy = [r["reward"] for r in graded if r["mode"] == "greedy"]
    assert metrics["validation/accuracy"] == pytest.approx(sum(greedy) / len(greedy))
