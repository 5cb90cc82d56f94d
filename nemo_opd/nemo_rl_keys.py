"""NeMo-RL's distillation keys and what each became here: the converter's key map
(`python -m nemo_opd.convert nemo-rl`, which also applies the conversions the notes describe),
read by the config errors too (an unknown key NeMo-RL users know says what it is here). It
imports nothing of the package, so it stands below both: config/ below convert/, each reads it.

A key's fate is one of:
    same      the same key, the same meaning
    renamed   another key (or value spelling) here, the same meaning
    changed   the nearest key here behaves differently; the note says how
    dropped   no equivalent; the note says why, and what to use instead if anything

Paths are NeMo-RL's, with `{model}` for either `policy` or `teacher`; `*` matches one key. A
path not listed is looked up by its sections (`policy.megatron_cfg.fp8_cfg.fp8` by
`{model}.megatron_cfg.fp8_cfg`), so an entry for a section covers every key under it.
Entries for `teacher` come before those for `{model}`: the teacher is frozen here.
docs/nemo_rl.md is the same map in prose.
"""

from collections.abc import Sequence
from fnmatch import fnmatchcase
from typing import Literal, NamedTuple

Kind = Literal["same", "renamed", "changed", "dropped"]

CONVERTER = "python -m nemo_opd.convert nemo-rl FILE -o OUT.yaml"
"""The command that converts a whole NeMo-RL config (named in error messages)."""


class Fate(NamedTuple):
    """What a NeMo-RL key became here: its kind, the key here (None when dropped; with
    `{model}` when the NeMo-RL path has it) and a note (why, or what differs)."""

    kind: Kind
    target: str | None = None
    note: str = ""


def _same(*paths: str) -> dict[str, Fate]:
    return {path: Fate("same", path) for path in paths}


def _dropped(note: str, *paths: str) -> dict[str, Fate]:
    return {path: Fate("dropped", None, note) for path in paths}


FROZEN = "the teacher is frozen and never samples (optimizer, scheduler and generation null)"

TEACHER_FROZEN: dict[str, Fate] = _dropped(
    FROZEN,
    "teacher.optimizer",
    "teacher.scheduler",
    "teacher.generation",
    "teacher.generation_batch_size",
    "teacher.train_global_batch_size",
    "teacher.train_micro_batch_size",
    "teacher.max_grad_norm",
    "teacher.dynamic_batching.train_mb_tokens",
    "teacher.sequence_packing.train_mb_tokens",
    "teacher.megatron_cfg.optimizer",
    "teacher.megatron_cfg.scheduler",
    "teacher.offload_optimizer_for_logprob",
)

_LOOP: dict[str, Fate] = {
    **_same(
        *(
            f"distillation.{key}"
            for key in (
                "num_prompts_per_step",
                "num_generations_per_prompt",
                "max_rollout_turns",
                "max_num_steps",
                "max_num_epochs",
                "val_batch_size",
                "val_period",
                "val_at_start",
                "val_at_end",
                "topk_logits_k",
                "seed",
            )
        )
    ),
    "distillation.max_val_samples": Fate(
        "changed",
        "distillation.max_val_samples",
        "validation prompts here; NeMo-RL counts rows of the validation set after "
        "data.validation.repeat, so its value is divided by the repeat",
    ),
    **_same("loss_fn.kl_type", "loss_fn.mixed_kl_weight"),
    "loss_fn.zero_outside_topk": Fate(
        "changed",
        "loss_fn.tail",
        "false is tail: renormalize (both sides renormalized over the teacher's top-k, the "
        "same loss); true is tail: bucket, which keeps the teacher's mass outside its top-k as "
        "one bucket where NeMo-RL counts it as zero (log 1e-100) against the student's whole "
        "distribution (docs/loss.md)",
    ),
}

_CHECKPOINTING: dict[str, Fate] = {
    **_same(
        "checkpointing.enabled",
        "checkpointing.checkpoint_dir",
        "checkpointing.higher_is_better",
        "checkpointing.keep_top_k",
        "checkpointing.save_period",
    ),
    "checkpointing.metric_name": Fate(
        "changed",
        "checkpointing.metric_name",
        "'val:X' is 'validation/X' and 'train:X' 'train/X' here; NeMo-RL's val:accuracy is "
        "the mean over data.validation.repeat samples, validation/accuracy_avg@k here "
        "(validation/accuracy is greedy)",
    ),
    **_dropped(
        "no save by a deadline: SIGTERM (a scheduler's notice) saves a checkpoint at the next "
        "step's end",
        "checkpointing.checkpoint_must_save_by",
    ),
    **_dropped("checkpoints and exports are always safetensors", "checkpointing.model_save_format"),
    **_dropped(
        "the final model is always exported whole in Hugging Face format (final_model/), and "
        "python -m nemo_opd.export writes any checkpoint so",
        "checkpointing.save_consolidated",
    ),
    **_dropped(
        "a checkpoint always holds the optimizer state (resuming needs it), in its own "
        "folder; an exported model never does",
        "checkpointing.save_optimizer",
    ),
}

_MEGATRON_SAME = (
    "enabled",
    "tensor_model_parallel_size",
    "pipeline_model_parallel_size",
    "context_parallel_size",
    "expert_model_parallel_size",
    "sequence_parallel",
    "activation_checkpointing",
)

_MODEL: dict[str, Fate] = {
    **_same(
        *(
            f"{{model}}.{key}"
            for key in (
                "model_name",
                "precision",
                "train_global_batch_size",
                "train_micro_batch_size",
                "logprob_batch_size",
                "max_total_sequence_length",
                "max_grad_norm",
                "make_sequence_length_divisible_by",
                "tokenizer.name",
            )
        )
    ),
    "{model}.tokenizer.chat_template": Fate(
        "changed",
        "{model}.tokenizer.chat_template",
        "null is the tokenizer's own template here; NeMo-RL's null is a passthrough template "
        "(the messages' text joined) and its \"default\" the tokenizer's own",
    ),
    **_same("{model}.tokenizer.chat_template_kwargs"),
    **_dropped(
        "vLLM takes each step's prompts at once and schedules its own batches",
        "{model}.generation_batch_size",
    ),
    "{model}.logprob_chunk_size": Fate(
        "changed",
        "{model}.logits_chunk_tokens",
        "positions whose logits exist at once, in training and scoring alike; NeMo-RL's "
        "chunks only the log-prob pass, and its null (no chunks) is the default 256 here",
    ),
    **_dropped(
        "the optimizer state stays where it is (dtensor_cfg.cpu_offload keeps it in host "
        "memory throughout)",
        "{model}.offload_optimizer_for_logprob",
    ),
    # optimizer and schedule (DTensor's torch.optim section)
    "{model}.optimizer": Fate(
        "renamed",
        "{model}.optimizer",
        "torch.optim.AdamW's name and kwargs are name: adamw and the keys lr, weight_decay, "
        "betas and eps of the optimizer section itself",
    ),
    "{model}.optimizer.name": Fate(
        "renamed", "{model}.optimizer.name", "torch.optim.AdamW is adamw, the only optimizer"
    ),
    "{model}.optimizer.kwargs": Fate(
        "renamed",
        "{model}.optimizer",
        "lr, weight_decay, betas and eps are keys of the optimizer section itself",
    ),
    **{
        f"{{model}}.optimizer.kwargs.{key}": Fate("renamed", f"{{model}}.optimizer.{key}")
        for key in ("lr", "weight_decay", "betas", "eps")
    },
    **_dropped(
        "the engine chooses torch's AdamW implementation",
        "{model}.optimizer.kwargs.foreach",
        "{model}.optimizer.kwargs.fused",
    ),
    "{model}.scheduler": Fate(
        "changed",
        "{model}.scheduler",
        "NeMo-RL's list of torch schedulers is name, warmup_steps, min_lr_ratio and "
        "decay_steps here; a LinearLR warmup from start_factor x lr warms up from 0 here",
    ),
    # DTensor
    **_same(
        *(
            f"{{model}}.dtensor_cfg.{key}"
            for key in (
                "enabled",
                "cpu_offload",
                "sequence_parallel",
                "activation_checkpointing",
                "tensor_parallel_size",
                "context_parallel_size",
            )
        )
    ),
    **_dropped("one DTensor engine here (no versions)", "{model}.dtensor_cfg._v2"),
    **_dropped(
        "the tensor-parallel plan is built from the model's layers",
        "{model}.dtensor_cfg.custom_parallel_plan",
    ),
    # batching
    **_same(
        *(
            f"{{model}}.dynamic_batching.{key}"
            for key in ("enabled", "train_mb_tokens", "logprob_mb_tokens", "sequence_length_round")
        ),
        *(
            f"{{model}}.sequence_packing.{key}"
            for key in (
                "enabled",
                "train_mb_tokens",
                "logprob_mb_tokens",
                "algorithm",
                "sequence_length_round",
            )
        ),
    ),
    **_dropped(
        "packed microbatches run in the packer's order",
        "{model}.sequence_packing.microbatch_order",
    ),
    # Megatron
    **_same(*(f"{{model}}.megatron_cfg.{key}" for key in _MEGATRON_SAME)),
    "{model}.megatron_cfg.optimizer": Fate(
        "changed",
        "{model}.optimizer",
        "with Megatron enabled, lr, weight_decay, adam_beta1/2 and adam_eps are the optimizer "
        "section's (AdamW); min_lr is scheduler.min_lr_ratio; use_distributed_optimizer is "
        "megatron_cfg.distributed_optimizer (not supported yet: off); the precision follows "
        "policy.precision with fp32 master weights",
    ),
    "{model}.megatron_cfg.scheduler": Fate(
        "changed",
        "{model}.scheduler",
        "lr_decay_style is name, lr_warmup_iters warmup_steps, lr_decay_iters the warmup plus "
        "decay_steps; the warmup starts from 0, not lr_warmup_init; weight decay is constant",
    ),
    **_dropped(
        "Megatron's distributed checkpoints: checkpoints here are Hugging Face safetensors",
        "{model}.megatron_cfg.checkpoint",
    ),
    **_dropped(
        "the Hugging Face weights are converted in memory at every start",
        "{model}.megatron_cfg.force_reconvert_from_hf",
    ),
    **_dropped("no CUDA graphs in training", "{model}.megatron_cfg.cuda_graph_*"),
    **_dropped(
        "activation_checkpointing recomputes whole layers",
        "{model}.megatron_cfg.recompute_granularity",
        "{model}.megatron_cfg.recompute_modules",
    ),
    **_dropped(
        "no activation offloading",
        "{model}.megatron_cfg.fine_grained_activation_offloading",
        "{model}.megatron_cfg.offload_modules",
    ),
    **_dropped(
        "pipeline stages are not supported yet (pipeline_model_parallel_size 1)",
        "{model}.megatron_cfg.num_layers_in_first_pipeline_stage",
        "{model}.megatron_cfg.num_layers_in_last_pipeline_stage",
        "{model}.megatron_cfg.pipeline_dtype",
    ),
    **_dropped(
        "mixture-of-experts routing and dispatch are megatron-core's defaults",
        "{model}.megatron_cfg.moe_*",
        "{model}.megatron_cfg.freeze_moe_router",
        "{model}.megatron_cfg.expert_tensor_parallel_size",
    ),
    **_dropped(
        "the engine builds the local layer spec with every fusion off (the same on CPU and GPU)",
        "{model}.megatron_cfg.*_fusion",
        "{model}.megatron_cfg.use_fused_weighted_squared_relu",
    ),
    **_dropped(
        "the logits are cast to fp32 one chunk of positions at a time (logits_chunk_tokens)",
        "{model}.megatron_cfg.defer_fp32_logits",
    ),
    **_dropped(
        "megatron-core's data-parallel defaults",
        "{model}.megatron_cfg.distributed_data_parallel_config",
        "{model}.megatron_cfg.use_gloo_process_groups",
        "{model}.megatron_cfg.empty_unused_memory_level",
    ),
    **_dropped("no FP8 training", "{model}.megatron_cfg.fp8_cfg"),
    **_dropped(
        "LoRA is policy.lora, on the DTensor backend (docs/lora.md)",
        "{model}.megatron_cfg.peft",
    ),
    # generation
    **_same(
        *(
            f"{{model}}.generation.{key}"
            for key in (
                "backend",
                "max_new_tokens",
                "temperature",
                "top_p",
                "top_k",
                "stop_token_ids",
                "stop_strings",
                "colocated.enabled",
                "colocated.resources.gpus_per_node",
                "colocated.resources.num_nodes",
                "vllm_cfg.tensor_parallel_size",
                "vllm_cfg.gpu_memory_utilization",
                "vllm_cfg.max_model_len",
                "vllm_cfg.enforce_eager",
                "vllm_cfg.precision",
            )
        )
    ),
    "{model}.generation.val_temperature": Fate(
        "changed",
        "distillation.val_temperature",
        "the temperature of the avg@k validation samples; validation/accuracy is greedy here",
    ),
    **_dropped(
        "validation samples with the generation's top_p and top_k",
        "{model}.generation.val_top_p",
        "{model}.generation.val_top_k",
    ),
    **_dropped(
        "vLLM runs inside the generation workers: no HTTP ports",
        "{model}.generation.port_range_low",
        "{model}.generation.port_range_high",
    ),
    **_dropped(
        "only the vllm_cfg keys of docs/config.md reach vLLM", "{model}.generation.vllm_kwargs"
    ),
    **_dropped(
        "generation overlaps training through distillation.max_staleness instead",
        "{model}.generation.vllm_cfg.async_engine",
    ),
    **_dropped(
        "one single-device vLLM engine per generation worker, in its process",
        "{model}.generation.vllm_cfg.pipeline_parallel_size",
        "{model}.generation.vllm_cfg.expert_parallel_size",
        "{model}.generation.vllm_cfg.distributed_executor_backend",
    ),
    **_dropped(
        "vLLM computes in vllm_cfg.precision throughout",
        "{model}.generation.vllm_cfg.kv_cache_dtype",
        "{model}.generation.vllm_cfg.use_deep_gemm",
        "{model}.generation.vllm_cfg.num_last_layers_in_bf16",
        "{model}.generation.vllm_cfg.num_first_layers_in_bf16",
    ),
    **_dropped(
        "vLLM's log-probs of the sampled tokens are read after temperature (processed)",
        "{model}.generation.vllm_cfg.logprobs_mode",
    ),
}

_DATA: dict[str, Fate] = {
    **_same("data.shuffle"),
    "data.max_input_seq_length": Fate(
        "changed",
        "data.max_input_seq_length",
        "must be below policy.max_total_sequence_length here (room for a response); NeMo-RL's "
        "value equal to it is null here (max_total_sequence_length - 1)",
    ),
    "data.train": Fate(
        "changed",
        "data.dataset_name",
        "one training set, a hub dataset (data.dataset_name) or a local file "
        "(data.train_path); NeMo-RL's registry names (DeepScaler, AIME2024) are the hub "
        "datasets they load",
    ),
    "data.train.dataset_name": Fate(
        "renamed", "data.dataset_name", "NeMo-RL's registry names are the hub datasets they load"
    ),
    "data.train.data_path": Fate("renamed", "data.train_path"),
    "data.validation": Fate(
        "changed",
        "data.val_dataset_name",
        "one validation set (data.val_dataset_name or data.val_path) sharing the training "
        "set's prompt and answer columns",
    ),
    "data.validation.dataset_name": Fate(
        "renamed",
        "data.val_dataset_name",
        "NeMo-RL's registry names are the hub datasets they load (with data.val_split)",
    ),
    "data.validation.data_path": Fate("renamed", "data.val_path"),
    "data.validation.split": Fate("renamed", "data.val_split"),
    "data.validation.repeat": Fate(
        "changed",
        "distillation.val_samples_per_prompt",
        "k samples of every validation prompt, logged as validation/accuracy_avg@k and "
        "pass@k beside the greedy validation/accuracy; NeMo-RL repeats the prompts in the "
        "set and reports their mean as accuracy",
    ),
    "data.*.input_key": Fate("renamed", "data.prompt_key"),
    "data.*.output_key": Fate("renamed", "data.answer_key"),
    "data.*.prompt_file": Fate(
        "renamed", "data.prompt_file", "one template for every dataset, relative to where you run"
    ),
    "data.*.system_prompt_file": Fate(
        "renamed", "data.system_prompt_file", "one system prompt for every dataset"
    ),
    **_dropped(
        "every prompt is graded by the math environment (env.math)",
        "data.*.env_name",
        "data.*.processor",
    ),
    **_dropped(
        "the training set's own split is read (train)",
        "data.train.split",
        "data.train.subset",
    ),
    **_dropped(
        "a separate validation set is named instead (data.val_dataset_name or data.val_path)",
        "data.train.split_validation_size",
        "data.train.seed",
    ),
    **_dropped(
        "the chat template decides the special tokens",
        "data.add_bos",
        "data.add_eos",
        "data.add_generation_prompt",
        "data.add_system_prompt",
    ),
    **_dropped("data loading runs in the driver", "data.num_workers"),
    **_dropped("settings for every dataset are the data section's own keys here", "data.default"),
}

_REST: dict[str, Fate] = {
    **_same("env.math.num_workers"),
    **_same(
        "logger.log_dir",
        "logger.wandb_enabled",
        "logger.tensorboard_enabled",
        "logger.wandb.project",
        "logger.wandb.name",
    ),
    **_dropped(
        "TensorBoard writes under logger.log_dir/tensorboard (logger.tensorboard_enabled)",
        "logger.tensorboard",
    ),
    **_dropped(
        "metrics go to metrics.jsonl, TensorBoard and W&B only",
        "logger.mlflow",
        "logger.mlflow_enabled",
        "logger.swanlab",
        "logger.swanlab_enabled",
        "logger.wandb.log_nemo_gym_full_result_tables",
    ),
    **_dropped("no GPU-monitoring metrics", "logger.monitor_gpus", "logger.gpu_monitoring"),
    **_dropped(
        "python -m nemo_opd.evaluate writes every graded validation response to a JSONL "
        "(logger.num_rollouts_to_log prints training rollouts)",
        "logger.num_val_samples_to_print",
    ),
    **_same("cluster.num_nodes", "cluster.gpus_per_node"),
    **_dropped(
        "process groups choose a free port",
        "cluster.master_port_range_low",
        "cluster.master_port_range_high",
    ),
    **_dropped("no NVLink-domain placement", "cluster.segment_size"),
}

KEY_MAP: dict[str, Fate] = {**_LOOP, **_CHECKPOINTING, **_MODEL, **_DATA, **_REST}
"""NeMo-RL path (pattern) -> its fate here; see the module docstring."""

CATCH_ALL: dict[str, Fate] = {
    pattern: Fate("dropped", None, what if "," in what else f"{what} with no equivalent here")
    for pattern, what in {
        "{model}.dtensor_cfg.*": "a DTensor setting",
        "{model}.megatron_cfg.*": "a Megatron setting",
        "{model}.generation.vllm_cfg.*": "a vLLM setting",
        "{model}.generation.*": "a generation setting",
        "data.*": "a dataset setting",
        "env.math.*": "a math-environment setting",
        "env.*": "another environment, with no equivalent: the math environment is the only one",
        "logger.*": "a logger setting",
        "cluster.*": "a cluster setting",
        "*": "a section",
    }.items()
}
"""The converter's last resort for keys of NeMo-RL's sections that KEY_MAP does not list
(never used for error hints: a typo of one of this schema's keys is not NeMo-RL's key)."""

MODELS = ("policy", "teacher")


def fate_of(path: Sequence[str | int]) -> Fate:
    """The converter's fate for a NeMo-RL key path: the teacher's frozen keys first, then the
    path's own entry, then its sections' (`{model}` in the target filled in), then CATCH_ALL."""
    parts = [str(part) for part in path]
    if parts[0] == "teacher":
        for end in range(1, len(parts) + 1):
            fate = TEACHER_FROZEN.get(".".join(parts[:end]))
            if fate is not None:
                return fate
    for table in (KEY_MAP, CATCH_ALL):
        for end in range(len(parts), 0, -1):
            fate = _lookup(parts[:end], table)
            if fate is not None:
                return fate
    raise AssertionError("CATCH_ALL's '*' matches every key")


def unknown_key_hint(path: Sequence[str | int]) -> str | None:
    """What NeMo-RL's key of exactly this path is here, for a message about a key this schema
    does not have (or not in that form); None when NeMo-RL has no such key in KEY_MAP, or the
    same key with the same meaning."""
    parts = [str(part) for part in path]
    fate = TEACHER_FROZEN.get(".".join(parts)) or (_lookup(parts, KEY_MAP) if parts else None)
    if fate is None or fate.kind == "same":
        return None
    note = f" ({fate.note})" if fate.note else ""
    if fate.kind == "dropped":
        return f"NeMo-RL's key, with no equivalent here: {fate.note}"
    if fate.target == ".".join(parts):  # the same key, written another way here
        return f"NeMo-RL's form of the key, which differs here: {fate.note}"
    if fate.kind == "changed":
        return f"NeMo-RL's key; the nearest here is {fate.target}, which differs{note}"
    return f"NeMo-RL's key; it is {fate.target} here{note}"


def _lookup(parts: list[str], table: dict[str, Fate]) -> Fate | None:
    """The entry of `table` for exactly this path: listed, or matched by a pattern of as many
    keys; `{model}` stands for policy or teacher."""
    model = parts[0] if parts[0] in MODELS else None
    names = [".".join(parts)]
    if model is not None:
        names.append(".".join(["{model}", *parts[1:]]))
    for name in names:
        if name in table:
            return _filled(table[name], model)
    for pattern, fate in table.items():
        same_length = "*" in pattern and pattern.count(".") == len(parts) - 1
        if same_length and any(fnmatchcase(name, pattern) for name in names):
            return _filled(fate, model)
    return None


def _filled(fate: Fate, model: str | None) -> Fate:
    """The fate with `{model}` in its target replaced by `model`."""
    if fate.target is None or model is None:
        return fate
    return fate._replace(target=fate.target.replace("{model}", model))
