"""A trained student as users load any Hugging Face model: the exported folder and what it holds.

    final_model/                  (checkpointing.checkpoint_dir/final_model, or -o of
                                   python -m nemo_opd.export for a checkpoint)
      config.json                 the model's config, dtype = the policy's precision
      model.safetensors           the weights in the policy's precision (bf16 when the run
                                  trains in bf16), lm_head left out when tied
      tokenizer files             the run's tokenizer (tokenizer.json, tokenizer_config.json)
      chat_template.jinja         the chat template the run rendered with
      generation_config.json      the base model's (when it has one), decoding as the run
                                  validates: greedy, up to generation.max_new_tokens, stopping
                                  at the tokenizer's EOS and the run's stop token ids
      adapter/                    a LoRA student only: its peft adapter
      nemo_opd_export.json        written last: what was exported (utils.export_folder)

Nothing of the training state (optimizer, scheduler, RNG, step): that stays in the checkpoint
it came from (step_N/policy/training_state.pt and nemo_opd.json), which is what resuming reads.
The weights are written by the engine (Policy.export) for the final model, and here, from a
checkpoint's fp32 weights, for any checkpoint (export_checkpoint). Either way the folder is
written whole into a new folder or over an earlier export, never over anything else
(nemo_opd.utils.export_folder).
"""

import json
from pathlib import Path

from safetensors.torch import load_file
from transformers import GenerationConfig, PreTrainedTokenizerBase

from nemo_opd.config import PolicyConfig
from nemo_opd.errors import SetupError
from nemo_opd.policy.engines.lora import ADAPTER_WEIGHTS_FILE
from nemo_opd.policy.engines.training_state import WEIGHTS_FILE, write_weights
from nemo_opd.utils.checkpoint_manager import STATE_FILE
from nemo_opd.utils.export_folder import export_directory

POLICY_DIR = "policy"
"""The student's folder inside a checkpoint (step_N/policy)."""


def write_model_files(
    target: Path, tokenizer: PreTrainedTokenizerBase, policy: PolicyConfig
) -> None:
    """Add the tokenizer, its chat template and generation_config.json to an exported model
    folder whose weights and config.json are written."""
    tokenizer.save_pretrained(str(target))
    generation_config(tokenizer, policy).save_pretrained(str(target))


def generation_config(tokenizer: PreTrainedTokenizerBase, policy: PolicyConfig) -> GenerationConfig:
    """The base model's generation config (a new one when it has none here), decoding as the
    run's validation decodes, whose accuracy is the one the run reports: greedy (the base
    model's sampling settings dropped) up to generation.max_new_tokens, stopping where the run
    stopped (the tokenizer's EOS and generation.stop_token_ids). Sampling is for training
    rollouts; a user who wants it sets do_sample and a temperature."""
    try:
        config = GenerationConfig.from_pretrained(policy.model_name)
    except (OSError, ValueError):  # no generation_config.json (or no network to fetch one)
        config = GenerationConfig()
    stops = _ids(config.eos_token_id) + _ids(tokenizer.eos_token_id)
    config.do_sample = False
    config.temperature = config.top_p = config.top_k = None  # sampling only
    if policy.generation is not None:
        stops += list(policy.generation.stop_token_ids or [])
        config.max_new_tokens = policy.generation.max_new_tokens
    unique = list(dict.fromkeys(stops))
    config.eos_token_id = unique[0] if len(unique) == 1 else unique or None
    if tokenizer.bos_token_id is not None:
        config.bos_token_id = tokenizer.bos_token_id
    if tokenizer.pad_token_id is not None:
        config.pad_token_id = tokenizer.pad_token_id
    return config


def _ids(value: int | list[int] | None) -> list[int]:
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def checkpoint_weights_dir(path: Path) -> Path:
    """The folder holding a checkpoint's Hugging Face weights: `path` itself (an export, or a
    checkpoint's policy folder) or `path`/policy (a checkpoint, step_N). SetupError, naming
    what was looked for, when neither holds them or when they are LoRA adapters only."""
    for candidate in (path, path / POLICY_DIR):
        if (candidate / WEIGHTS_FILE).is_file() and (candidate / "config.json").is_file():
            return candidate
        if (candidate / ADAPTER_WEIGHTS_FILE).is_file():
            raise SetupError(
                f"{candidate} is a LoRA checkpoint (its adapters only): use the run's "
                "final_model (merged), or load the adapter with peft on policy.model_name"
            )
    raise SetupError(
        f"no model in {path}: expected {WEIGHTS_FILE} and config.json there or in "
        f"{path / POLICY_DIR} (a checkpoint step_N, its policy folder, or an exported model)"
    )


CHECKPOINT_FILES = ("training_state.pt", "nemo_opd.json", STATE_FILE)
"""Files only a checkpoint holds: a folder with one of them is never replaced by an export."""


def _check_not_a_checkpoint(target: Path, source: Path) -> None:
    """SetupError when writing `target` would replace the checkpoint (or hold it)."""
    where = target.resolve()
    if where == source.resolve() or where in source.resolve().parents:
        raise SetupError(f"the export folder {target} is the checkpoint itself; name another")
    if any((target / name).exists() for name in CHECKPOINT_FILES):
        raise SetupError(f"{target} holds a checkpoint; export into a folder of its own")


def export_checkpoint(
    checkpoint: Path, target: Path, tokenizer: PreTrainedTokenizerBase, policy: PolicyConfig
) -> Path:
    """Export a checkpoint's student as the final model is exported: its fp32 weights cast to
    policy.precision, config, tokenizer, chat template, generation_config.json, written whole
    into a new folder or over an earlier export (SetupError for any other folder)."""
    source = checkpoint_weights_dir(checkpoint)
    _check_not_a_checkpoint(target, source)
    weights = load_file(source / WEIGHTS_FILE)
    hf_config = json.loads((source / "config.json").read_text())
    record = {"checkpoint": str(checkpoint.resolve()), "step": checkpoint_step(source)}
    with export_directory(target, record) as tmp:
        write_weights(tmp, weights, hf_config, policy.precision)
        write_model_files(tmp, tokenizer, policy)
    return target


def checkpoint_step(weights_dir: Path) -> int | None:
    """The step of the checkpoint whose weights are in `weights_dir` (step_N/policy): its
    training_state.json's; None for a folder that is not in a checkpoint."""
    for folder in (weights_dir, weights_dir.parent):
        try:
            step = json.loads((folder / STATE_FILE).read_text()).get("step")
        except (OSError, ValueError, AttributeError):
            continue
        return step if isinstance(step, int) else None
    return None
