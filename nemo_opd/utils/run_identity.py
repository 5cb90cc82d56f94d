"""What a run is, recorded with its checkpoints and its metrics, so that a run resumes only its own.

A run's identity is the part of its config that gives its checkpoints and metrics their
meaning (IDENTITY_KEYS): the models (student, teachers, their tokenizers and chat templates,
LoRA, the training backend), the data (sources, columns, templates, order), the objective and
its divergence, and the shapes a checkpoint's state is made of (prompts and generations per
step, top-k, batch and sequence sizes, the seed). Everything else may change when a run is
resumed: max_num_steps, max_num_epochs, validation, logging, the checkpoint cadence, the
learning rate, the cluster's layout.

Where it is recorded:
    <checkpoint_dir>/step_N/training_state.json   "run": the identity of the run that saved it
    <logger.log_dir>/run_identity.json             the identity and checkpoint directory of the
                                                   run that logs there (written at setup)

check_run_folders(cfg) runs before anything starts (no Ray, no model loaded): the newest
checkpoint of checkpointing.checkpoint_dir and the metrics in logger.log_dir must be this run's
(its identity, and for the metrics its checkpoint directory), or it raises SetupError naming
each difference (old -> new) and the ways out: folders of its own, or checkpointing.resume=force
to take them over as they are. Checkpoints saved before identities were recorded are compared
with the run_config.json that their run wrote into the log directory; without one they are
refused. A run with checkpointing off (it starts at step 0) is refused in a checkpoint_dir
that holds checkpoints of later steps, and the final model in checkpoint_dir/final_model may be
written over only by a run that starts at or after the step it was exported at. A run whose
checkpoints are done (the newest step >= max_num_steps) and exported is reported as having
nothing to do.
"""

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nemo_opd.config import DistillationConfig
from nemo_opd.errors import SetupError
from nemo_opd.utils.checkpoint_manager import RUN_KEY, CheckpointError, CheckpointManager
from nemo_opd.utils.export_folder import FINAL_MODEL_DIR, check_export_target, exported_step

IDENTITY_FILE = "run_identity.json"
"""In logger.log_dir: {"identity": ..., "checkpoint_dir": ...} of the run that logs there."""
RUN_CONFIG_FILE = "run_config.json"
METRICS_FILE = "metrics.jsonl"
FORCE = "checkpointing.resume=force"

IDENTITY_KEYS = (
    # the models
    "policy.model_name",
    "policy.tokenizer.name",
    "policy.tokenizer.chat_template",
    "policy.megatron_cfg.enabled",
    "policy.lora.enabled",
    "policy.lora.rank",
    "policy.lora.alpha",
    "policy.lora.target_modules",
    "teacher.model_name",
    "teacher.tokenizer.name",
    "teacher.tokenizer.chat_template",
    "teacher.prompt_template",
    "teacher.source",
    "teachers.*.model_name",
    "teachers.*.tokenizer.name",
    # the data
    "data.dataset_name",
    "data.train_path",
    "data.prompt_key",
    "data.answer_key",
    "data.response_key",
    "data.teacher_key",
    "data.prompt_file",
    "data.system_prompt_file",
    "data.max_input_seq_length",
    "data.shuffle",
    # the objective
    "objective",
    "loss_fn",
    "distillation.lmbda",
    "distillation.seq_kd",
    "distillation.teacher_temperature",
    "policy.generation.temperature",
    # the shapes
    "distillation.num_prompts_per_step",
    "distillation.num_generations_per_prompt",
    "distillation.max_rollout_turns",
    "distillation.topk_logits_k",
    "distillation.seed",
    "policy.train_global_batch_size",
    "policy.max_total_sequence_length",
    "policy.generation.max_new_tokens",
)
"""Dotted keys of the config (a section stands for every key under it; `*` for every name)."""
NOT_IDENTITY = frozenset({"loss_fn.implementation"})
"""Keys under IDENTITY_KEYS' sections that do not change what a run computes."""
_SHOWN = 6
_VALUE_CHARS = 80


def run_identity(cfg: DistillationConfig | dict) -> dict[str, dict[str, Any]]:
    """{identity key: {config key: value}} of a config (or of its model_dump in JSON mode, as
    run_config.json holds it)."""
    dump = cfg if isinstance(cfg, dict) else cfg.model_dump(mode="json")
    return {key: dict(_leaves(dump, key.split("."), [])) for key in IDENTITY_KEYS}


def _leaves(node: Any, parts: list[str], path: list[str]) -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every leaf that `parts` names under `node`; a missing part
    gives the key with None, a section every key under it."""
    if not parts:
        if isinstance(node, dict):
            for name, value in node.items():
                yield from _leaves(value, [], [*path, name])
        elif ".".join(path) not in NOT_IDENTITY:
            yield ".".join(path), node
        return
    head, rest = parts[0], parts[1:]
    if head == "*":
        for name, value in (node or {}).items():
            yield from _leaves(value, rest, [*path, name])
    elif isinstance(node, dict) and node.get(head) is not None:
        yield from _leaves(node[head], rest, [*path, head])
    else:
        yield ".".join([*path, *parts]), None


def differences(recorded: dict, current: dict, legacy: bool = False) -> list[str]:
    """`key: old -> new` for every config key whose value differs, over the identity keys both
    records have (a key added to IDENTITY_KEYS later is not held against an older record).
    legacy: `recorded` comes from a run_config.json, which holds the "tiny:" models' folders
    where the config had their names."""
    found = []
    for key in IDENTITY_KEYS:
        if key not in recorded or key not in current:
            continue
        old, new = recorded[key], current[key]
        for name in sorted(set(old) | set(new)):
            before, after = old.get(name), new.get(name)
            if before != after and not (legacy and _same_tiny_model(before, after)):
                found.append(f"{name}: {_show(before)} -> {_show(after)}")
    return found


def _same_tiny_model(recorded: Any, name: Any) -> bool:
    """Whether a run_config.json's folder is the "tiny:" model `name` (setup replaces the
    names by the folders of the cached build: <cache>/tiny/<recipe key>/<role>)."""
    if not (isinstance(recorded, str) and isinstance(name, str) and name.startswith("tiny:")):
        return False
    path = Path(recorded)
    role = name.removeprefix("tiny:").rsplit("_", 1)[-1]
    return path.name == role and len(path.parts) >= 3 and path.parts[-3] == "tiny"


def _show(value: Any) -> str:
    """The value as JSON; a long one keeps its two ends (a path's root and file name)."""
    text = "(none)" if value is None else json.dumps(value)
    if len(text) <= _VALUE_CHARS:
        return text
    half = (_VALUE_CHARS - 3) // 2
    return text[:half] + "..." + text[-half:]


def _listed(found: list[str]) -> str:
    more = len(found) - _SHOWN
    return "; ".join(found[:_SHOWN]) + (f"; and {more} more" if more > 0 else "")


# ---------------------------------------------------------------------------------- the folders


@dataclass
class NewestCheckpoint:
    """The newest checkpoint whose record reads: its step and the identity it records (None:
    saved before identities were recorded)."""

    path: Path
    step: int
    identity: dict | None


def newest_checkpoint(manager: CheckpointManager) -> NewestCheckpoint | None:
    """The newest checkpoint of `manager`'s directory with a readable record (its files are
    not verified here: resume_point does that), or None."""
    for step, path in reversed(manager.checkpoints().items()):
        try:
            record = manager.load_state(path)
        except CheckpointError:
            continue
        identity = record.get(RUN_KEY)
        return NewestCheckpoint(path, step, identity if isinstance(identity, dict) else None)
    return None


def check_run_folders(cfg: DistillationConfig) -> str | None:
    """SetupError unless checkpointing.checkpoint_dir and logger.log_dir are this run's, or
    new, or checkpointing.resume is force; and unless its final model may be written. `cfg`
    has its paths made absolute (run_dirs.with_absolute_paths). Returns the line to print
    when there is nothing to do: the newest checkpoint has all the steps and is exported."""
    current = run_identity(cfg)
    checkpoint_dir = Path(cfg.checkpointing.checkpoint_dir)
    log_dir = Path(cfg.logger.log_dir)
    newest = newest_checkpoint(CheckpointManager(cfg.checkpointing))
    force = cfg.checkpointing.resume == "force"
    if newest is not None and not force:
        _check_checkpoint(newest, current, checkpoint_dir, log_dir)
    if not force:
        _check_log_dir(log_dir, current, checkpoint_dir, has_checkpoints=newest is not None)
    final = checkpoint_dir / FINAL_MODEL_DIR
    check_export_target(final, earlier_unmarked=True)
    resumes = cfg.checkpointing.enabled and newest is not None
    if not force and not cfg.checkpointing.enabled:
        _check_checkpoints_left(newest, checkpoint_dir)
    if not force:
        _check_final_model(final, newest.step if resumes else 0, cfg.checkpointing.enabled)
    steps = cfg.distillation.max_num_steps
    if not cfg.checkpointing.enabled or newest is None or newest.step < steps:
        return None
    if exported_step(final) != newest.step:
        return None
    return (
        f"nothing to do: step {newest.step} >= {steps} (distillation.max_num_steps), and "
        f"{final} holds the model of step {newest.step}; raise distillation.max_num_steps to "
        "train on, or give a new run its own checkpointing.checkpoint_dir and logger.log_dir"
    )


def _check_checkpoint(
    newest: NewestCheckpoint, current: dict, checkpoint_dir: Path, log_dir: Path
) -> None:
    """SetupError when the newest checkpoint was saved by a run with another identity."""
    legacy = newest.identity is None
    recorded = newest.identity if not legacy else _legacy_identity(log_dir)
    if recorded is None:
        raise SetupError(
            f"checkpointing.checkpoint_dir {checkpoint_dir} holds checkpoints (newest: step "
            f"{newest.step}) saved before nemo_opd recorded what made them, and logger.log_dir "
            f"has no {RUN_CONFIG_FILE} to compare this run with: give this run its own "
            f"checkpointing.checkpoint_dir, or resume them as they are with {FORCE}"
        )
    found = differences(recorded, current, legacy=legacy)
    if found:
        raise SetupError(
            f"checkpointing.checkpoint_dir {checkpoint_dir} holds the checkpoints of another run "
            f"(newest: step {newest.step}), which differs from this one: {_listed(found)}. "
            "Give this run folders of its own (checkpointing.checkpoint_dir=... "
            f"logger.log_dir=...), or resume those checkpoints with these changes: {FORCE}"
        )


def _check_checkpoints_left(newest: NewestCheckpoint | None, checkpoint_dir: Path) -> None:
    """SetupError when a run with checkpointing off would start at step 0 in a checkpoint
    directory that holds a run's checkpoints of later steps: it would cut that run's metrics
    back and leave its own final model beside them."""
    if newest is None or newest.step == 0:
        return
    raise SetupError(
        f"checkpointing.checkpoint_dir {checkpoint_dir} holds the checkpoints of a run (newest: "
        f"step {newest.step}), and this run has checkpointing.enabled=false: it would start at "
        "step 0 beside them and write its final model there. Give this run its own "
        "checkpointing.checkpoint_dir and logger.log_dir, or resume them with "
        f"checkpointing.enabled=true, or take the folder over with {FORCE}"
    )


def _check_final_model(final: Path, start: int, checkpointing: bool) -> None:
    """SetupError when `final` holds the model a run exported at a later step than the one this
    run starts from: at its end this run would write a model of fewer steps over it (a run with
    checkpointing off starts from step 0 whatever its folder holds)."""
    exported = exported_step(final)
    if exported is None or exported <= start:
        return
    why = "its newest checkpoint" if start else "there is no checkpoint to resume"
    if not checkpointing:
        why = "checkpointing.enabled=false: it resumes nothing"
    raise SetupError(
        f"{final} holds the final model that a run exported at step {exported}; this run "
        f"starts at step {start} ({why}) and would write its own model over it at its end. "
        "Give this run its own checkpointing.checkpoint_dir, or move that model away, or "
        f"replace it at the end with {FORCE}"
    )


def _check_log_dir(log_dir: Path, current: dict, checkpoint_dir: Path, has_checkpoints: bool):
    """SetupError when logger.log_dir holds the metrics of a run with another identity or
    another checkpoint directory."""
    metrics = log_dir / METRICS_FILE
    if not metrics.is_file() or metrics.stat().st_size == 0:
        return
    ways_out = f"give this run its own logger.log_dir, or append to them with {FORCE}"
    owner = _read_json(log_dir / IDENTITY_FILE)
    if isinstance(owner, dict) and isinstance(owner.get("identity"), dict):
        found = differences(owner["identity"], current)
        theirs, ours = owner.get("checkpoint_dir"), str(checkpoint_dir)
        if not found and theirs not in (None, ours):
            found = [f"checkpointing.checkpoint_dir: {_show(theirs)} -> {_show(ours)}"]
    elif has_checkpoints:
        return  # the checkpoints' own run (checked above), logging before identities existed
    else:
        legacy = _legacy_identity(log_dir)
        if legacy is None:
            raise SetupError(
                f"logger.log_dir {log_dir} holds metrics ({METRICS_FILE}) of a run that nemo_opd "
                f"cannot tell (no {IDENTITY_FILE} or {RUN_CONFIG_FILE}): {ways_out}"
            )
        found = differences(legacy, current, legacy=True)
    if found:
        raise SetupError(
            f"logger.log_dir {log_dir} holds the metrics of another run, which differs from "
            f"this one: {_listed(found)}. Its {METRICS_FILE} and {RUN_CONFIG_FILE} would be "
            f"overwritten: {ways_out}"
        )


def _legacy_identity(log_dir: Path) -> dict | None:
    """The identity of the run_config.json in `log_dir` (None when there is none)."""
    config = _read_json(log_dir / RUN_CONFIG_FILE)
    return run_identity(config) if isinstance(config, dict) else None


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def record_log_owner(cfg: DistillationConfig) -> None:
    """Write logger.log_dir/run_identity.json: this run logs there (after check_run_folders)."""
    log_dir = Path(cfg.logger.log_dir)
    record = {"identity": run_identity(cfg), "checkpoint_dir": cfg.checkpointing.checkpoint_dir}
    log_dir.mkdir(parents=True, exist_ok=True)
    tmp = log_dir / f".{IDENTITY_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
    tmp.replace(log_dir / IDENTITY_FILE)
