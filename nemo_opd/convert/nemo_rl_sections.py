"""The NeMo-RL sections that change shape on the way here, and the checks that need the whole
config (steps 2 and 4 of nemo_rl.py).

Each converter reads NeMo-RL's keys from the Builder, writes nemo_opd's and records a row per
NeMo-RL key, so that the generic pass (the key map) leaves those keys alone.
"""

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nemo_opd.config.key_paths import has_path
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.convert.nemo_rl_builder import MISSING, Builder, Row, leaves
from nemo_opd.convert.nemo_rl_schedule import (
    Schedule,
    convert_megatron_schedule,
    convert_torch_schedule,
)
from nemo_opd.nemo_rl_keys import fate_of

DATASETS: dict[str, dict[str, str]] = {
    "DeepScaler": {
        "name": "agentica-org/DeepScaleR-Preview-Dataset",
        "split": "train",
        "prompt_key": "problem",
        "answer_key": "answer",
    },
    "AIME2024": {
        "name": "HuggingFaceH4/aime_2024",
        "split": "train",
        "prompt_key": "problem",
        "answer_key": "answer",
    },
}
"""NeMo-RL's registry names of math datasets -> the hub dataset, split and columns they load."""

RESPONSE_DATASET_KEYS = {"prompt_key": "input", "answer_key": "output"}
"""The columns NeMo-RL's file datasets read when input_key / output_key are not given."""


# -------- the loss ---------------------------------------------------------------------------


def convert_loss(b: Builder) -> None:
    """loss_fn.zero_outside_topk -> loss_fn.tail: false is the same loss (renormalize), true the
    nearest (bucket, the teacher's own tail kept)."""
    source = "loss_fn.zero_outside_topk"
    if b.value(source) is MISSING:
        return
    if b.value(source):
        b.row("changed", source, "loss_fn.tail", "bucket", fate_of(source.split(".")).note)
    else:
        b.row(
            "renamed",
            source,
            "loss_fn.tail",
            "renormalize",
            "both sides renormalized over the teacher's top-k: the same loss",
        )


# -------- optimizer and schedule ----------------------------------------------------------------


def convert_optimizer(b: Builder) -> None:
    """The student's optimizer and schedule: DTensor's torch.optim section and scheduler list,
    or with Megatron enabled megatron_cfg.optimizer and .scheduler (what NeMo-RL uses then)."""
    megatron = b.value("policy.megatron_cfg.enabled") is True
    unused = "policy.optimizer" if megatron else "policy.megatron_cfg.optimizer"
    why = (
        "Megatron is enabled: NeMo-RL trains with megatron_cfg.optimizer and .scheduler"
        if megatron
        else "Megatron is disabled: NeMo-RL trains with policy.optimizer and policy.scheduler"
    )
    for section in (unused, unused.replace("optimizer", "scheduler")):
        _drop_all(b, section, why)
    if megatron:
        _megatron_optimizer(b)
        schedule = convert_megatron_schedule(
            b.value("policy.megatron_cfg.scheduler"), b.value("policy.megatron_cfg.optimizer")
        )
        _schedule_rows(b, "policy.megatron_cfg.scheduler", schedule)
    else:
        _torch_optimizer(b)
        lr = b.written("policy.optimizer.lr")
        schedule = convert_torch_schedule(b.value("policy.scheduler"), lr)
        _schedule_rows(b, "policy.scheduler", schedule)


def _drop_all(b: Builder, section: str, why: str) -> None:
    """Record every key under `section` as dropped for `why`."""
    value = b.value(section)
    if value is MISSING:
        return
    for path, _ in leaves(value, tuple(section.split("."))):
        b.row("dropped", path, note=why)


def _torch_optimizer(b: Builder) -> None:
    """policy.optimizer {name: torch.optim.AdamW, kwargs: {...}} -> {name: adamw, lr, ...}."""
    name = b.value("policy.optimizer.name")
    if name is not MISSING:
        if str(name).rsplit(".", 1)[-1].lower() == "adamw":
            b.row("renamed", "policy.optimizer.name", "policy.optimizer.name", "adamw")
        else:
            b.row(
                "changed",
                "policy.optimizer.name",
                "policy.optimizer.name",
                "adamw",
                f"{name} is not available: AdamW is the only optimizer here",
            )
    kwargs = b.value("policy.optimizer.kwargs")
    for key, value in (kwargs if isinstance(kwargs, dict) else {}).items():
        source = f"policy.optimizer.kwargs.{key}"
        if key in ("lr", "weight_decay", "eps"):
            b.row("renamed", source, f"policy.optimizer.{key}", value)
        elif key == "betas":
            b.row("renamed", source, "policy.optimizer.betas", list(value))
        else:
            b.by_key_map(tuple(source.split(".")))


_MEGATRON_OPTIMIZER = {"lr": "lr", "weight_decay": "weight_decay", "adam_eps": "eps"}


def _megatron_optimizer(b: Builder) -> None:
    """policy.megatron_cfg.optimizer -> policy.optimizer (AdamW) and the keys it touches."""
    section = "policy.megatron_cfg.optimizer"
    values = b.value(section)
    values = values if isinstance(values, dict) else {}
    for key, value in values.items():
        source = f"{section}.{key}"
        if key in _MEGATRON_OPTIMIZER:
            b.row("renamed", source, f"policy.optimizer.{_MEGATRON_OPTIMIZER[key]}", value)
        elif key in ("adam_beta1", "adam_beta2"):
            betas = [values.get("adam_beta1", 0.9), values.get("adam_beta2", 0.999)]
            b.row("renamed", source, "policy.optimizer.betas", betas)
        elif key == "optimizer":
            kind = "renamed" if value == "adam" else "changed"
            note = "Megatron's adam is AdamW (decoupled weight decay)"
            if value != "adam":
                note = f"{value} is not available: AdamW is the only optimizer here"
            b.row(kind, source, "policy.optimizer.name", "adamw", note)
        elif key == "clip_grad":
            b.row("renamed", source, "policy.max_grad_norm", value)
        elif key == "use_distributed_optimizer":
            _distributed_optimizer(b, source, value)
        elif key == "min_lr":
            b.row("changed", source, note="becomes scheduler.min_lr_ratio (min_lr / lr)")
        elif key in ("bf16", "fp16", "params_dtype"):
            b.row("dropped", source, note="the engine trains in policy.precision, fp32 master")
        else:
            b.row("dropped", source, note="a Megatron optimizer setting with no equivalent here")


def _distributed_optimizer(b: Builder, source: str, value: Any) -> None:
    target = "policy.megatron_cfg.distributed_optimizer"
    if value:
        note = "not supported yet: AdamW's state is replicated over data-parallel ranks"
        b.row("changed", source, target, False, note)
    else:
        b.row("renamed", source, target, False)


def _schedule_rows(b: Builder, source: str, schedule: Schedule) -> None:
    """Write the converted schedule and record its row(s)."""
    b.write("policy.scheduler", schedule.section)
    if b.value(source) is MISSING:
        return
    note = "; ".join(schedule.notes)
    b.row(schedule.kind, source, "policy.scheduler", schedule.section, note, write=False)


# -------- data and validation --------------------------------------------------------------------


def convert_data(b: Builder) -> None:
    """data.train / data.validation / data.default -> the data section's keys; the dataset's
    registry name to the hub dataset it loads."""
    _max_input_length(b)
    _dataset(b, "train")
    _dataset(b, "validation")
    for name in ("prompt_file", "system_prompt_file"):
        _prompt_file(b, name)


def _max_input_length(b: Builder) -> None:
    source = "data.max_input_seq_length"
    value, longest = b.value(source), b.value("policy.max_total_sequence_length")
    if value is MISSING:
        return
    if value is None or (isinstance(longest, int) and value >= longest):
        note = "null: max_total_sequence_length - 1, the longest that leaves room for a response"
        b.row("changed", source, source, None, note)
    else:
        b.row("same", source, source, value)


def _dataset(b: Builder, split: str) -> None:
    """One of data.train / data.validation (a dataset, or NeMo-RL's list of them)."""
    section = f"data.{split}"
    value = b.value(section)
    if value is MISSING or value is None:
        return
    if isinstance(value, list):
        for index, item in enumerate(value[1:], start=1):
            note = "one dataset per split here: the first is used"
            b.rows.append(Row("dropped", f"{section}[{index}]", item, note=note))
        raw = b.value(section, raw=True)
        b.replace(section, raw[0] if raw else {}, value[0] if value else {})
        value = b.value(section)
    prefix = "" if split == "train" else "val_"
    keys: dict[str, str] = {}
    for key, item in value.items():
        source = f"{section}.{key}"
        if key == "dataset_name":
            keys |= _registry_dataset(b, source, item, prefix)
        elif key == "data_path":
            target = f"data.{'train' if split == 'train' else 'val'}_path"
            located, note = _locate(b.files, item)
            if not _is_local_file(item):
                target, located, note = f"data.{prefix}dataset_name", item, ""
            b.row("renamed", source, target, located, note)
            keys |= RESPONSE_DATASET_KEYS
        elif key == "repeat" and split == "validation":
            continue  # convert_validation
        elif key in ("input_key", "output_key"):
            ours = "prompt_key" if key == "input_key" else "answer_key"
            keys[ours] = item
            b.row("renamed", source, f"data.{ours}", item, write=False)
        elif key == "split" and split == "validation":
            b.row("renamed", source, "data.val_split", item)
        elif key in ("prompt_file", "system_prompt_file"):
            continue  # _prompt_file
        else:
            b.by_key_map(tuple(source.split(".")))
    _columns(b, keys, section)


def _registry_dataset(b: Builder, source: str, name: Any, prefix: str) -> dict[str, str]:
    """A dataset_name: NeMo-RL's registry name -> its hub dataset (and split and columns);
    a hub path as it is; anything else is left for the user (a row saying so)."""
    target = f"data.{prefix}dataset_name"
    known = DATASETS.get(str(name))
    if known is not None:
        note = f"NeMo-RL's {name} loads {known['name']} ({known['split']} split)"
        b.row("renamed", source, target, known["name"], note)
        if prefix:
            b.write("data.val_split", known["split"])
        return {"prompt_key": known["prompt_key"], "answer_key": known["answer_key"]}
    if isinstance(name, str) and "/" in name:
        b.row("same", source, target, name, "a hub dataset, loaded by name")
        return {}
    note = (
        f"NeMo-RL's registry name {name!r} is not known here: set {target} to the hub "
        "dataset it loads (or data.train_path / data.val_path to a local file)"
    )
    b.row("dropped", source, note=note)
    return {}


def _columns(b: Builder, keys: dict[str, str], section: str) -> None:
    """data.prompt_key / answer_key from a dataset; one pair here serves both splits."""
    for ours, column in keys.items():
        earlier = b.written(f"data.{ours}")
        if earlier is not MISSING and earlier != column:
            b.rows.append(
                _note_row(
                    b,
                    section,
                    f"the validation set's {ours} ({column!r}) differs from the training "
                    f"set's ({earlier!r}); one column name serves both here: rename a column",
                )
            )
            continue
        b.write(f"data.{ours}", column)


def _is_local_file(path: Any) -> bool:
    return isinstance(path, str) and path.endswith((".jsonl", ".json", ".parquet"))


def _prompt_file(b: Builder, name: str) -> None:
    """data.{train,validation,default}.prompt_file -> data.prompt_file: the training set's own,
    else the default's; found on disk from here or beside the NeMo-RL config."""
    sources = [f"data.{part}.{name}" for part in ("train", "default", "validation")]
    present = [source for source in sources if b.value(source) is not MISSING]
    if not present:
        return
    chosen, *others = present
    value = b.value(chosen)
    located, note = _locate(b.files, value)
    b.row("renamed", chosen, f"data.{name}", located, note)
    for source in others:
        if b.value(source) == value:
            b.row("renamed", source, f"data.{name}", located, write=False)
        else:
            b.row("dropped", source, note=f"one {name} for every dataset here: {chosen}'s is used")


def _locate(configs: list[Path], value: Any) -> tuple[Any, str]:
    """A file NeMo-RL names relative to where it runs (its checkout's root), as the converted
    config should name it: absolute (a relative path in a config is relative to the config's
    own folder here). Found from the working directory, else under a folder holding one of the
    NeMo-RL config files; kept as written when it is nowhere."""
    if not isinstance(value, str) or Path(value).is_absolute():
        return value, ""
    if Path(value).exists():
        return str(Path(value).resolve()), f"{value} from here, written absolute"
    for config in configs:
        for folder in config.resolve().parents:
            candidate = folder / value
            if candidate.is_file():
                return str(candidate), f"{value} of NeMo-RL's checkout, at {candidate}"
    return value, f"{value} is not found from here: copy it, or set data.prompt_file"


def convert_validation(b: Builder) -> None:
    """NeMo-RL's validation samples (repeat times, at val_temperature) and reports their mean
    as accuracy: here distillation.val_samples_per_prompt = repeat (or 1) and the ranking
    metric validation/accuracy_avg@k, beside the greedy accuracy."""
    repeat = b.value("data.validation.repeat")
    has_validation = b.value("data.validation") not in (MISSING, None)
    k = repeat if isinstance(repeat, int) and repeat > 0 else 1
    if repeat is not MISSING:
        b.row(
            "changed",
            "data.validation.repeat",
            "distillation.val_samples_per_prompt",
            k,
            fate_of(["data", "validation", "repeat"]).note,
        )
    elif has_validation:
        b.write("distillation.val_samples_per_prompt", 1)
    limit = b.value("distillation.max_val_samples")
    if limit is not MISSING:
        prompts = None if limit is None else max(1, math.ceil(limit / k))
        note = f"prompts ({limit} rows / {k} samples each)" if k > 1 else "prompts"
        b.row(
            "changed" if k > 1 else "same",
            "distillation.max_val_samples",
            "distillation.max_val_samples",
            prompts,
            note if k > 1 else "",
        )
    temperature = b.value("policy.generation.val_temperature")
    if temperature is not MISSING:
        b.row(
            "renamed",
            "policy.generation.val_temperature",
            "distillation.val_temperature",
            temperature,
            fate_of(["policy", "generation", "val_temperature"]).note,
        )
    _metric_name(b, k)


def _metric_name(b: Builder, k: int) -> None:
    source = "checkpointing.metric_name"
    name = b.value(source)
    if name is MISSING:
        return
    if not isinstance(name, str) or ":" not in name:
        b.row("same", source, source, name)
        return
    prefix, metric = name.split(":", 1)
    if prefix == "val" and metric == "accuracy":
        ours = f"validation/accuracy_avg@{k}"
        note = f"NeMo-RL's val:accuracy is the mean over {k} sampled response(s) per prompt"
        b.row("changed", source, source, ours, note + "; validation/accuracy is greedy here")
        return
    ours = f"{'validation' if prefix == 'val' else prefix}/{metric}"
    b.row("renamed", source, source, ours, "NeMo-RL's val:X is validation/X here")


# -------- models: tokenizer and values not supported yet ---------------------------------------

UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], Any, str]] = {
    "megatron_cfg.pipeline_model_parallel_size": (
        lambda v: v > 1,
        1,
        "pipeline parallelism is not supported yet by the Megatron engine",
    ),
    "megatron_cfg.expert_model_parallel_size": (
        lambda v: v > 1,
        1,
        "expert parallelism is not supported yet by the Megatron engine",
    ),
    "megatron_cfg.sequence_parallel": (lambda v: v, False, "not supported yet"),
    "dtensor_cfg.sequence_parallel": (lambda v: v, False, "not supported yet"),
    "generation.vllm_cfg.tensor_parallel_size": (
        lambda v: v > 1,
        1,
        "only 1 is supported yet: each generation worker runs one single-device engine",
    ),
}
"""Values of the enabled backend this project does not run yet: NeMo-RL key (under policy or
teacher) -> (is it such a value, what is written instead, why)."""


def convert_models(b: Builder) -> None:
    """For the student and the teacher: values not supported yet, and the tokenizer's chat
    template (NeMo-RL's null is a passthrough template; its "default" the tokenizer's own)."""
    for model in ("policy", "teacher"):
        if b.value(model) is MISSING:
            continue
        megatron = b.value(f"{model}.megatron_cfg.enabled") is True
        backend = "megatron_cfg" if megatron else "dtensor_cfg"
        for key, (unsupported, instead, why) in UNSUPPORTED.items():
            source = f"{model}.{key}"
            value = b.value(source)
            in_use = key.startswith(backend) or key.startswith("generation")
            if value is not MISSING and in_use and unsupported(value):
                b.row("changed", source, source, instead, why)
        _chat_template(b, model)
        _logits_chunks(b, model)


def _logits_chunks(b: Builder, model: str) -> None:
    """logprob_chunk_size -> logits_chunk_tokens; NeMo-RL's null (no chunks) is our default."""
    source = f"{model}.logprob_chunk_size"
    value = b.value(source)
    if value is MISSING:
        return
    note = fate_of(source.split(".")).note
    b.row("changed", source, f"{model}.logits_chunk_tokens", value, note, write=value is not None)


def _chat_template(b: Builder, model: str) -> None:
    source = f"{model}.tokenizer.chat_template"
    value = b.value(source)
    if value is not MISSING:
        if value is None:
            note = "NeMo-RL's null is a passthrough template, not available here: the tokenizer's"
            b.row("changed", source, source, None, note)
        elif str(value).lower() == "default":
            b.row("renamed", source, source, None, 'NeMo-RL\'s "default" is null here')
        else:
            b.row("same", source, source, value)
    kwargs_source = f"{model}.tokenizer.chat_template_kwargs"
    kwargs = b.value(kwargs_source)
    if kwargs is not MISSING and has_path(DistillationConfig, kwargs_source.split(".")):
        b.row("same", kwargs_source, kwargs_source, kwargs)
    elif kwargs is not MISSING:
        note = fate_of(kwargs_source.split(".")).note
        if kwargs is None:
            note = "null: nothing to carry over"
        b.row("dropped", kwargs_source, note=note)


# -------- what needs the whole config ------------------------------------------------------------


def finish_checkpoint_ranking(b: Builder) -> None:
    """A checkpoint ranked by a validation metric needs a fresh one at every save: NeMo-RL
    leaves a checkpoint saved between validations out of the ranking, here save_period is a
    multiple of val_period. The save period is rounded up to one."""
    metric = b.written("checkpointing.metric_name")
    save, val = b.written("checkpointing.save_period"), b.written("distillation.val_period")
    ranked = isinstance(metric, str) and metric.startswith("validation/")
    if not ranked or not isinstance(save, int) or not isinstance(val, int):
        return
    if b.written("checkpointing.keep_top_k") is None:
        return
    if val == 0:
        b.write("checkpointing.metric_name", None)
        _amend(b, "checkpointing.metric_name", None, "no validation (val_period 0): by step")
    elif save % val:
        rounded = math.ceil(save / val) * val
        b.write("checkpointing.save_period", rounded)
        _amend(
            b,
            "checkpointing.save_period",
            rounded,
            f"every {rounded} steps, a multiple of distillation.val_period ({val}): each "
            "checkpoint is ranked by a fresh validation (NeMo-RL leaves those saved between "
            "validations out of the ranking)",
        )


def finish_parallel_within_node(b: Builder) -> None:
    """On several nodes a model's tensor x context parallel group stays inside a node here (its
    collectives run at every layer); NeMo-RL lets it span nodes. The context-parallel size is
    lowered until the group fits (then the tensor-parallel size, if it alone does not)."""
    nodes, per_node = b.written("cluster.num_nodes"), b.written("cluster.gpus_per_node")
    if not isinstance(nodes, int) or nodes < 2 or not isinstance(per_node, int):
        return
    for model in ("policy", "teacher"):
        megatron = b.written(f"{model}.megatron_cfg.enabled") is True
        section = f"{model}.megatron_cfg" if megatron else f"{model}.dtensor_cfg"
        tp_key = "tensor_model_parallel_size" if megatron else "tensor_parallel_size"
        tp, cp = b.written(f"{section}.{tp_key}"), b.written(f"{section}.context_parallel_size")
        if not isinstance(tp, int) or not isinstance(cp, int) or per_node % (tp * cp) == 0:
            continue
        new_tp = tp if per_node % tp == 0 else math.gcd(tp, per_node)
        new_cp = max(d for d in range(1, cp + 1) if cp % d == 0 and per_node % (new_tp * d) == 0)
        why = (
            f"tensor x context parallel ({tp} x {cp}) stays inside one node of {per_node} "
            "here (its collectives run at every layer); NeMo-RL lets it span nodes"
        )
        for key, old, new in ((tp_key, tp, new_tp), ("context_parallel_size", cp, new_cp)):
            if new != old:
                b.write(f"{section}.{key}", new)
                _amend(b, f"{section}.{key}", new, why)


def finish_wandb(b: Builder) -> None:
    """NeMo-RL's configs log to W&B; without the wandb package here the config would not load,
    so logging to W&B is turned off, and the row says how to turn it on."""
    if b.written("logger.wandb_enabled") is True and importlib.util.find_spec("wandb") is None:
        b.write("logger.wandb_enabled", False)
        note = "wandb is not installed here: install the wandb extra, then set it true"
        _amend(b, "logger.wandb_enabled", False, note)


def _amend(b: Builder, source: str, written: Any, note: str) -> None:
    """Turn a key's row into a changed one: the value written and why."""
    for row in b.rows:
        if row.source == source:
            row.kind, row.written, row.note = "changed", written, note


def _note_row(b: Builder, section: str, note: str) -> Row:
    return Row("changed", section, "(see note)", note=note)


SECTION_CONVERTERS: tuple[Callable[[Builder], None], ...] = (
    convert_loss,
    convert_optimizer,
    convert_data,
    convert_validation,
    convert_models,
)
FINISHERS: tuple[Callable[[Builder], None], ...] = (
    finish_checkpoint_ranking,
    finish_parallel_within_node,
    finish_wandb,
)
