"""What every engine saves, restores and moves the same way, whatever its backend: the checkpoint
files (docs/policy.md), per-rank RNG states, and model plus optimizer state between devices.

Checkpoint directory (written by rank 0 into an atomic temporary directory):
    config.json          the Hugging Face config, dtype float32
    model.safetensors    fp32 weights under Hugging Face names (lm_head omitted when tied)
                         (a LoRA student: adapter_model.safetensors and adapter_config.json
                         instead, peft's adapter format; see lora.py)
    training_state.pt    {"optimizer": full state by HF name or None, "scheduler": ..., "rng":
                         [every rank's RNG state]}
    nemo_opd.json        {"optimizer_steps": optimizer steps taken} (not the loop's step: a
                         loop step takes several optimizer steps; older checkpoints wrote
                         "step", still read)
"""

import json
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from nemo_opd.utils.checkpoint import write_limits

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
WEIGHTS_FILE = "model.safetensors"
TRAINING_STATE_FILE = "training_state.pt"
META_FILE = "nemo_opd.json"


def rng_state() -> dict:
    """This process's torch (and CUDA) RNG state."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def gather_rng_states() -> list[dict]:
    """Every rank's RNG state, in rank order (a collective over the default group)."""
    states = [None] * dist.get_world_size()
    dist.all_gather_object(states, rng_state())
    return states


def write_weights(
    tmp: Path, weights: dict[str, torch.Tensor], hf_config: dict, dtype: str = "float32"
) -> None:
    """model.safetensors and config.json of a full-weight checkpoint (float32, the master
    weights) or export (the policy's precision: its floating-point tensors cast to `dtype`,
    and config.json's dtype saying so)."""
    weights = {name: _cast(tensor, DTYPES[dtype]).contiguous() for name, tensor in weights.items()}
    save_file(weights, tmp / WEIGHTS_FILE, metadata={"format": "pt"})
    config = dict(hf_config)
    config.pop("_attn_implementation_autoset", None)
    config["torch_dtype"] = config["dtype"] = dtype
    (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def write_training_state(
    tmp: Path, optimizer: dict | None, scheduler: dict | None, rng: list[dict], step: int
) -> None:
    """training_state.pt and nemo_opd.json of a checkpoint (see the module docstring)."""
    state = {"optimizer": optimizer, "scheduler": scheduler, "rng": rng}
    try:
        torch.save(state, tmp / TRAINING_STATE_FILE)
    except RuntimeError as error:  # torch's writer does not say why a write failed
        raise OSError(
            f"writing {tmp / TRAINING_STATE_FILE} failed ({error}); {write_limits(tmp)}"
        ) from error
    (tmp / META_FILE).write_text(json.dumps({"optimizer_steps": step}))


def read_training_state(root: Path) -> dict | None:
    """training_state.pt of a checkpoint, or None when it has none (a weights-only export)."""
    path = root / TRAINING_STATE_FILE
    return torch.load(path, weights_only=False) if path.exists() else None


def restore_rng(states: list[dict]) -> None:
    """Set this rank's RNG state from a checkpoint's list, when the world size is the same."""
    if len(states) != dist.get_world_size():
        return
    state = states[dist.get_rank()]
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def read_step(root: Path, default: int) -> int:
    """The optimizer steps a checkpoint was taken after (`default` when it records none)."""
    meta = root / META_FILE
    if not meta.exists():
        return default
    record = json.loads(meta.read_text())
    return record["optimizer_steps"] if "optimizer_steps" in record else record["step"]


def move_training_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device
) -> None:
    """Move parameters, gradients and optimizer state to `device` (offload and onload)."""
    model.to(device)
    if optimizer is None:
        return
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and key != "step":
                state[key] = value.to(device)
