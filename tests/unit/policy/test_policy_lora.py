"""LoRA students (policy.lora) against independent single-process references.

Every layout (one process, tp2, dp2, packed rows over cp2) checks on one Policy: at
initialization its log-probs are the base model's; two AdamW steps have the losses and gradient
norms of a plain Hugging Face model with peft's adapters, trained on one process; afterwards its
log-probs are that model's, the refit weights are peft's own merge of it, a Hugging Face model
loaded with them gives the adapter model's log-probs, and no frozen weight moved. A tp2
checkpoint (the tp2 layout's Policy, trained on) holds only the adapters and their optimizer
state, loads in peft, and resumes exactly; the export is the merged model plus the adapter.
"""

import json

import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from references import load_reference, reference_logprobs, reference_train
from safetensors.torch import load_file
from tiny_policies import make_batch, policy_config, running_policy, train_after_resume
from transformers import AutoModelForCausalLM

from nemo_opd.distributed.worker_group import WorkerError
from nemo_opd.losses import DistillationLossFn, TopkKLParams
from nemo_opd.policy.engines.lora import hf_name, inject_lora, is_adapter, train_only_adapters

K = 4
LOGPROB_ATOL = 2e-5
LOSS_RTOL = 1e-4
LORA = {
    "lora__enabled": True,
    "lora__rank": 4,
    "lora__alpha": 8.0,
    "lora__learning_rate": 5e-3,
    "lora__target_modules": ["q_proj", "v_proj", "o_proj", "up_proj", "down_proj"],
}
LAYOUTS = {
    "world1": ("tied", 1, {}),
    "tp2": (
        "untied",
        2,
        {"dtensor_cfg__tensor_parallel_size": 2, "dtensor_cfg__activation_checkpointing": True},
    ),
    "dp2": ("tied", 2, {}),
    "packed_cp2": (
        "untied",
        2,
        {
            "dtensor_cfg__context_parallel_size": 2,
            "sequence_packing__enabled": True,
            "sequence_packing__train_mb_tokens": 64,
            "sequence_packing__logprob_mb_tokens": 64,
            "sequence_packing__sequence_length_round": 1,
        },
    ),
}


def lora_reference(model_dir: str, cfg) -> torch.nn.Module:
    """The Hugging Face model with peft's adapters, initialized as the engine's are."""
    reference = load_reference(model_dir)
    inject_lora(reference, cfg.lora)
    train_only_adapters(reference)
    return reference


def peft_merged(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """{HF name: weight} after peft's own merge (in place) of every adapter into its base."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, LoraLayer):
                module.merge()
    return {hf_name(n): p.detach() for n, p in model.named_parameters() if not is_adapter(n)}


def logprob_error(logprobs: torch.Tensor, expected: torch.Tensor) -> float:
    return float((logprobs - expected).abs().max())


def layout_batch() -> dict:
    batch = make_batch(8, k=K, seed=3)
    batch["sample_mask"][5] = 0.0
    return batch


def layout_run(policy) -> dict:
    """What a fresh LoRA Policy answers on layout_batch(): its initial log-probs and refit
    weights, two top-k steps, its log-probs and merged weights after them."""
    batch = layout_batch()
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")
    return {
        "initial": policy.get_logprobs(batch),
        "initial_weights": policy.full_weights(),  # refit before training, as the loop does
        "metrics": policy.train(batch, loss_fn),
        "trained": policy.get_logprobs(batch),
        "merged": policy.full_weights(),
    }


def layout_config(model_dirs, layout: str):
    kind, _, overrides = LAYOUTS[layout]
    return policy_config(model_dirs[kind], **LORA, **overrides)


@pytest.fixture(scope="module")
def tp2_student(model_dirs):
    """(the tp2 layout's Policy after its layout_run, that run): its layout test reads the run,
    the checkpoint test trains the Policy on."""
    with running_policy(layout_config(model_dirs, "tp2"), 2, name="lora_tp2") as policy:
        yield policy, layout_run(policy)


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_lora_layout_matches_reference(layout, model_dirs, request):
    kind, workers, _ = LAYOUTS[layout]
    model_dir = model_dirs[kind]
    cfg = layout_config(model_dirs, layout)
    batch = layout_batch()
    loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="mixed"), implementation="torch")
    if layout == "tp2":
        _, run = request.getfixturevalue("tp2_student")
    else:
        with running_policy(cfg, workers, name=f"lora_{layout}") as policy:
            run = layout_run(policy)
    initial, initial_weights, metrics = run["initial"], run["initial_weights"], run["metrics"]
    trained, merged = run["trained"], run["merged"]

    base = load_reference(model_dir)
    base_weights = dict(base.named_parameters())
    assert logprob_error(initial, reference_logprobs(base, batch)) < LOGPROB_ATOL
    for name, tensor in base_weights.items():  # B = 0: the merge is the base
        torch.testing.assert_close(initial_weights[name], tensor.detach(), rtol=0, atol=0)

    reference = lora_reference(model_dir, cfg)
    losses, norms, _, _ = reference_train(
        reference, batch, loss_fn, cfg, cfg.train_global_batch_size
    )
    close = {"rtol": LOSS_RTOL, "atol": 0.0}
    torch.testing.assert_close(torch.tensor(metrics["loss"]), torch.tensor(losses), **close)
    torch.testing.assert_close(torch.tensor(metrics["grad_norm"]), torch.tensor(norms), **close)
    assert metrics["lr"][1] == pytest.approx(cfg.lora.learning_rate)  # after 1 warmup step
    assert logprob_error(trained, reference_logprobs(reference, batch)) < LOGPROB_ATOL

    expected = peft_merged(reference)
    assert set(merged) == set(base_weights) | {"lm_head.weight"}
    moved = []
    for name, tensor in expected.items():
        torch.testing.assert_close(merged[name], tensor, rtol=0, atol=2e-6, msg=name)
        if not torch.equal(merged[name], base_weights[name].detach()):
            moved.append(name)
    targets = tuple(cfg.lora.target_modules)
    assert moved and all(name.rsplit(".", 2)[-2] in targets for name in moved), moved

    base.load_state_dict(merged)
    merged_error = logprob_error(reference_logprobs(base, batch), trained)
    assert merged_error < LOGPROB_ATOL, f"merged model differs by {merged_error:.3g}"
    print(f"\nlora {layout}: merged vs adapter log-probs {merged_error:.2g}")


def test_lora_checkpoint_holds_adapters_resumes_and_exports(model_dirs, tp2_student, tmp_path):
    policy, _ = tp2_student  # two steps of its layout run taken
    model_dir = model_dirs[LAYOUTS["tp2"][0]]
    cfg = layout_config(model_dirs, "tp2")
    first, second = make_batch(4, k=K, seed=21), make_batch(4, k=K, seed=22)
    loss_fn = DistillationLossFn(implementation="torch")
    checkpoint, export = tmp_path / "step_3", tmp_path / "final_model"
    policy.train(first, loss_fn)
    saved_logprobs = policy.get_logprobs(second)
    policy.save(str(checkpoint))
    policy.export(str(export))
    continued = policy.train(second, loss_fn)

    # Adapters and their optimizer state only: no base weight is written.
    files = sorted(path.name for path in checkpoint.iterdir())
    assert files == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "nemo_opd.json",
        "training_state.pt",
    ]
    adapters = load_file(checkpoint / "adapter_model.safetensors")
    assert adapters and all(".lora_A." in k or ".lora_B." in k for k in adapters)
    optimizer = torch.load(checkpoint / "training_state.pt", weights_only=False)["optimizer"]
    assert set(optimizer["state"]) and all(is_adapter(name) for name in optimizer["state"])
    assert json.loads((checkpoint / "adapter_config.json").read_text())["r"] == cfg.lora.rank

    # peft loads the checkpoint's adapter onto the base model: the policy's log-probs.
    adapted = PeftModel.from_pretrained(load_reference(model_dir), str(checkpoint))
    assert logprob_error(reference_logprobs(adapted, second), saved_logprobs) < LOGPROB_ATOL

    # The export: a merged Hugging Face model, and the adapter beside it.
    merged = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    assert logprob_error(reference_logprobs(merged, second), saved_logprobs) < LOGPROB_ATOL
    assert (export / "adapter" / "adapter_model.safetensors").exists()
    exported = load_file(export / "adapter" / "adapter_model.safetensors")
    assert all(torch.equal(exported[k], adapters[k]) for k in adapters)

    again = train_after_resume(cfg, 2, str(checkpoint), second, loss_fn, step=3)
    for name in ("loss", "grad_norm", "lr"):
        torch.testing.assert_close(
            torch.tensor(again[name]), torch.tensor(continued[name]), rtol=1e-6, atol=0
        )


def test_a_checkpoint_of_the_other_kind_is_refused_with_the_fix(model_dirs, tmp_path):
    full, lora = policy_config(model_dirs["tied"]), policy_config(model_dirs["tied"], **LORA)
    with running_policy(full, 1) as policy:
        policy.save(str(tmp_path / "full"))
    with running_policy(lora, 1) as policy:
        with pytest.raises(WorkerError, match="holds no adapter_model.safetensors: it is not a"):
            policy.load(str(tmp_path / "full"))
        policy.save(str(tmp_path / "lora"))
    refused = pytest.raises(WorkerError, match="is a LoRA checkpoint .* policy.lora.enabled=true")
    with running_policy(full, 1) as policy, refused:
        policy.load(str(tmp_path / "lora"))
