"""nemo_opd.policy.engines.lora without workers: names, the merge, the TP plan, adapter files."""

import subprocess
import sys

import pytest
import torch
from peft.tuners.lora import LoraLayer
from tiny_policies import tiny_qwen3
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel
from transformers import AutoModelForCausalLM

from nemo_opd.config import LoraConfig
from nemo_opd.policy.engines.lora import (
    adapter_pairs,
    inject_lora,
    is_adapter,
    load_adapter,
    lora_block_plan,
    merged_weight,
    model_name,
    peft_name,
    save_adapter,
    train_only_adapters,
)

CFG = LoraConfig(enabled=True, rank=4, alpha=8.0, target_modules=["q_proj", "down_proj"])


@pytest.fixture
def model():
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(tiny_qwen3(tied=True), dtype=torch.float32)
    inject_lora(model, CFG)
    train_only_adapters(model)
    return model


def test_injection_is_seeded_leaves_the_rng_and_trains_only_adapters(model):
    again = AutoModelForCausalLM.from_config(tiny_qwen3(tied=True), dtype=torch.float32)
    state = torch.get_rng_state()
    inject_lora(again, CFG)
    assert torch.equal(torch.get_rng_state(), state)
    mine, theirs = dict(model.named_parameters()), dict(again.named_parameters())
    a = "model.layers.1.self_attn.q_proj.lora_A.default.weight"
    assert torch.equal(mine[a], theirs[a]) and mine[a].abs().sum() > 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and trainable == {n for n in mine if is_adapter(n)}
    assert {n.split(".")[-4] for n in trainable} == {"q_proj", "down_proj"}


def test_names_round_trip_between_model_and_peft_keys(model):
    for name in (n for n, _ in model.named_parameters() if is_adapter(n)):
        key = peft_name(name)
        assert key.startswith("base_model.model.model.layers.") and ".default." not in key
        assert model_name(key) == name
    with pytest.raises(ValueError, match="not a peft adapter key"):
        model_name("model.layers.0.self_attn.q_proj.lora_A.weight")


def test_merged_weight_is_the_wrapped_layer_in_float64(model):
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name, param in params.items():
            if ".lora_B." in name:
                param.normal_()
    base_name, (a, b, scaling) = next(iter(adapter_pairs(model).items()))
    assert scaling == CFG.alpha / CFG.rank
    base = params[base_name].detach().clone()
    merged = merged_weight(params[base_name], params[a], params[b], scaling)
    assert torch.equal(params[base_name], base)  # the base copy is untouched
    x = torch.randn(5, base.shape[1], dtype=torch.float64)
    layer = model.get_submodule(base_name.removesuffix(".base_layer.weight"))
    assert isinstance(layer, LoraLayer)
    with torch.no_grad():
        expected = layer.double()(x)
    torch.testing.assert_close(x @ merged.double().T, expected, rtol=1e-6, atol=1e-6)


def test_tp_plan_gives_each_factor_its_projections_layout(model):
    block = model.model.layers[0]
    plan = {
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(),
    }
    rewritten = lora_block_plan(block, plan)
    kinds = {path: type(style).__name__ for path, style in rewritten.items()}
    assert kinds == {
        "self_attn.q_proj.base_layer": "ColwiseParallel",
        "self_attn.q_proj.lora_B.default": "ColwiseParallel",
        "self_attn.k_proj": "ColwiseParallel",  # not a target: unchanged
        "mlp.down_proj.base_layer": "RowwiseParallel",
        "mlp.down_proj.lora_A.default": "RowwiseParallel",
    }


def test_an_adapter_of_other_settings_is_refused(model, tmp_path):
    weights = {peft_name(n): p.detach() for n, p in model.named_parameters() if is_adapter(n)}
    save_adapter(tmp_path, weights, CFG, "base")
    loaded = load_adapter(tmp_path, CFG)
    assert set(loaded) == {model_name(k) for k in weights}
    other = CFG.model_copy(update={"rank": 8})
    with pytest.raises(ValueError, match=r"has \(rank, alpha, targets\) \(4, 8.0"):
        load_adapter(tmp_path, other)
    with pytest.raises(FileNotFoundError, match="not a LoRA checkpoint"):
        load_adapter(tmp_path / "missing", CFG)


def test_targets_the_model_lacks_are_named():
    from transformers import Phi3Config

    config = Phi3Config(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, pad_token_id=0,
    )  # fmt: skip
    phi3 = AutoModelForCausalLM.from_config(config)  # fused qkv_proj and gate_up_proj
    with pytest.raises(ValueError, match=r"names \['gate_proj', 'k_proj', 'q_proj', 'up_proj', "):
        inject_lora(phi3, LoraConfig(enabled=True))
    only_q = CFG.model_copy(update={"target_modules": ["q_proj"]})  # matches nothing in Phi3
    with pytest.raises(ValueError, match=r"policy.lora.target_modules: .*q_proj"):
        inject_lora(AutoModelForCausalLM.from_config(config), only_q)


def test_a_policy_worker_without_lora_does_not_import_peft():
    # peft (and what it pulls in) costs seconds in every worker's start-up; lora imports it only
    # when a student takes adapters.
    code = (
        "import sys, nemo_opd.policy.worker, nemo_opd.policy.engines.dtensor;"
        "print('peft' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300
    )
    assert result.stdout.strip() == "False", result.stderr[-2000:]
