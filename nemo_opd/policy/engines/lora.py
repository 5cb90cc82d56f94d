"""LoRA students on the DTensor engine: peft's adapters inside the Hugging Face model.

    inject_lora(model, cfg)                 peft wraps the target projections (before TP/FSDP)
    lora_block_plan(block, plan)            the TP plan of a block whose projections are wrapped
    merged_weight(base, lora_a, lora_b, s)  W + s B A in fp32, the base left as it was
    merge_state(state, pairs)               a whole state dict merged, in HF names
    adapter_pairs(model)                    {base weight name: (A, B, scaling)}
    hf_name / peft_name / model_name        the three namings of a weight

peft's `inject_adapter_in_model` keeps the model a plain causal LM (no PeftModel wrapper), so
everything else in the engine (decoder layers, FSDP groups, activation checkpointing) is
unchanged. A wrapped projection `q_proj` holds `q_proj.base_layer` (the frozen nn.Linear),
`q_proj.lora_A.default` [r, in] and `q_proj.lora_B.default` [out, r]; its output is
base(x) + (alpha / r) * B(A(dropout(x))).

Tensor parallelism composes per projection (Megatron's LoRA layout): for a column-parallel base
(out split), B is column-parallel too and A replicated; for a row-parallel base (in split), A is
row-parallel (its [.., r] output summed over tp, r values per token) and B replicated. The
replicated factor sees the whole input or the whole (reduced) output, so its gradient is
complete on every tp rank and needs no extra reduction.
"""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors.torch import load_file, save_file
from torch.distributed.tensor.parallel import ColwiseParallel, ParallelStyle, RowwiseParallel

from nemo_opd.config import LoraConfig

if TYPE_CHECKING:
    import peft

ADAPTER = "default"
"""peft's name for the one adapter a student has (it appears in parameter names)."""
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
ADAPTER_CONFIG_FILE = "adapter_config.json"
PEFT_PREFIX = "base_model.model."
"""Prefix of every key in a peft adapter file (peft's PeftModel wraps the causal LM twice)."""


def peft_config(cfg: LoraConfig, base_model: str | None = None) -> "peft.LoraConfig":
    """peft's LoraConfig for policy.lora (alpha / rank scaling, no bias)."""
    import peft

    return peft.LoraConfig(
        r=cfg.rank,
        lora_alpha=cfg.alpha,
        lora_dropout=cfg.dropout,
        target_modules=list(cfg.target_modules),
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_model,
    )


def inject_lora(model: torch.nn.Module, cfg: LoraConfig) -> None:
    """Wrap the target projections of every decoder layer with adapters, in place. A is drawn
    from cfg.init_seed (the same on every rank, the global RNG untouched), B is zero: the
    model's outputs are unchanged until B trains. train_only_adapters sets what trains."""
    import peft

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.init_seed)
        try:
            peft.inject_adapter_in_model(peft_config(cfg), model)
        except ValueError as error:  # peft: none of the targets exists in the model
            raise ValueError(f"policy.lora.target_modules: {error}") from error
    wrapped = {name.rsplit(".", 3)[-3] for name in adapter_pairs(model)}
    missing = sorted(set(cfg.target_modules) - wrapped)
    if missing:
        raise ValueError(
            f"policy.lora.target_modules names {missing}, which this model "
            f"({type(model).__name__}) does not have; it has {sorted(wrapped)} of them"
        )


def train_only_adapters(model: torch.nn.Module) -> None:
    """Adapters require grad, every other parameter is frozen (call after tensor parallel,
    whose new parameters require grad)."""
    for name, param in model.named_parameters():
        param.requires_grad_(is_adapter(name))


def is_lora_layer(module: torch.nn.Module) -> bool:
    """Whether `module` is a projection peft wrapped with adapters. Only inject_lora makes one,
    and it imports peft first: a process that never did (every run without LoRA) has none, and
    does not import peft here (seconds of CPU in each worker's start-up)."""
    lora = sys.modules.get("peft.tuners.lora")
    return lora is not None and isinstance(module, lora.LoraLayer)


def is_adapter(name: str) -> bool:
    """Whether a parameter name (model naming) is an adapter factor."""
    return ".lora_A." in name or ".lora_B." in name


def lora_block_plan(
    block: torch.nn.Module, plan: dict[str, ParallelStyle]
) -> dict[str, ParallelStyle]:
    """`plan` (submodule path -> ColwiseParallel or RowwiseParallel) rewritten for a block whose
    projections peft may have wrapped: the base layer takes the projection's style, and the
    adapter factor on the split side takes the same style (see the module docstring)."""
    rewritten: dict[str, ParallelStyle] = {}
    for path, style in plan.items():
        module = block.get_submodule(path)
        if not is_lora_layer(module):
            rewritten[path] = style
            continue
        rewritten[f"{path}.base_layer"] = style
        if isinstance(style, ColwiseParallel):
            rewritten[f"{path}.lora_B.{ADAPTER}"] = ColwiseParallel()
        elif isinstance(style, RowwiseParallel):
            rewritten[f"{path}.lora_A.{ADAPTER}"] = RowwiseParallel()
        else:
            raise TypeError(f"no LoRA layout for {type(style).__name__} at {path}")
    return rewritten


def adapter_pairs(model: torch.nn.Module) -> dict[str, tuple[str, str, float]]:
    """{model name of a wrapped projection's base weight: (A's name, B's name, scaling)}."""
    pairs = {}
    for path, module in model.named_modules():
        if is_lora_layer(module) and ADAPTER in module.lora_A:
            pairs[f"{path}.base_layer.weight"] = (
                f"{path}.lora_A.{ADAPTER}.weight",
                f"{path}.lora_B.{ADAPTER}.weight",
                float(module.scaling[ADAPTER]),
            )
    return pairs


def merged_weight(
    base: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor:
    """base + scaling * B @ A as a new fp32 tensor (full tensors: base [out, in], A [r, in],
    B [out, r]); `base` is not modified."""
    return base.float() + scaling * (lora_b.float() @ lora_a.float())


def merge_state(
    state: dict[str, torch.Tensor], pairs: dict[str, tuple[str, str, float]]
) -> dict[str, torch.Tensor]:
    """{HF name: weight} of a LoRA model's full state dict (model naming): every wrapped
    projection merged (merged_weight, with adapter_pairs' `pairs`), the adapters left out, the
    other tensors as they are."""
    merged = {}
    for name, tensor in state.items():
        if is_adapter(name):
            continue
        if name in pairs:
            a, b, scaling = pairs[name]
            tensor = merged_weight(tensor, state[a], state[b], scaling)
        merged[hf_name(name)] = tensor
    return merged


def hf_name(name: str) -> str:
    """The Hugging Face name of a base weight in model naming (peft's `.base_layer` dropped)."""
    return name.replace(".base_layer.", ".")


def peft_name(name: str) -> str:
    """An adapter factor's key in a peft adapter file, from its model name:
    model.layers.0.self_attn.q_proj.lora_A.default.weight ->
    base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight."""
    return PEFT_PREFIX + name.replace(f".{ADAPTER}.", ".")


def model_name(key: str) -> str:
    """peft_name's inverse."""
    if not key.startswith(PEFT_PREFIX):
        raise ValueError(f"{key!r} is not a peft adapter key (they start with {PEFT_PREFIX!r})")
    name = key[len(PEFT_PREFIX) :]
    for factor in ("lora_A", "lora_B"):
        name = name.replace(f".{factor}.", f".{factor}.{ADAPTER}.")
    return name


def save_adapter(
    directory: Path, weights: dict[str, torch.Tensor], cfg: LoraConfig, base_model: str
) -> None:
    """Write a peft adapter (adapter_model.safetensors, adapter_config.json) into `directory`
    from {peft key: full tensor}; peft.PeftModel.from_pretrained(base, directory) loads it."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {key: tensor.contiguous() for key, tensor in weights.items()}
    save_file(tensors, directory / ADAPTER_WEIGHTS_FILE, metadata={"format": "pt"})
    peft_config(cfg, base_model).save_pretrained(str(directory))


def load_adapter(directory: Path, cfg: LoraConfig) -> dict[str, torch.Tensor]:
    """{model name: tensor} of a peft adapter written by save_adapter; an adapter of another
    rank, alpha or set of targets than policy.lora is refused."""
    path = directory / ADAPTER_WEIGHTS_FILE
    if not path.exists():
        raise FileNotFoundError(
            f"{directory} holds no {ADAPTER_WEIGHTS_FILE}: it is not a LoRA checkpoint (a "
            "full-weight one cannot resume a run with policy.lora.enabled)"
        )
    saved = json.loads((directory / ADAPTER_CONFIG_FILE).read_text())
    found = (saved["r"], float(saved["lora_alpha"]), sorted(saved["target_modules"]))
    wanted = (cfg.rank, float(cfg.alpha), sorted(cfg.target_modules))
    if found != wanted:
        raise ValueError(
            f"the adapter in {directory} has (rank, alpha, targets) {found}, but policy.lora "
            f"asks for {wanted}: resume with the settings it was trained with"
        )
    return {model_name(key): tensor for key, tensor in load_file(path).items()}


def lora_summary(model: torch.nn.Module, cfg: LoraConfig) -> str:
    """One line for the run's log: rank, targets, trainable and total parameters."""
    local = {n: p.numel() for n, p in model.named_parameters()}  # global shapes: DTensors
    adapters = sum(count for name, count in local.items() if is_adapter(name))
    total = sum(local.values())
    return (
        f"LoRA student: rank {cfg.rank}, alpha {cfg.alpha:g} on {', '.join(cfg.target_modules)}: "
        f"{adapters:,} trainable parameters of {total:,} ({100 * adapters / total:.2f}%)"
    )
