"""Checks on the student's and teacher's model configs, made on the driver before any worker
starts, so that a mismatch is one clear message instead of a worker traceback.

transformers is imported where a config is loaded, not with the module: the command line's
pre-flight (algorithms/preflight.py) runs check_weights before anything heavy is imported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from nemo_opd.algorithms.local_paths import missing_folder
from nemo_opd.config import PolicyConfig
from nemo_opd.errors import SetupError
from nemo_opd.models.head_families import UnknownHeadError, head_fields

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedTokenizerBase


def load_model_config(cfg: PolicyConfig, section: str) -> PretrainedConfig:
    """The Hugging Face config of a model section; a local path to no folder is refused here,
    without asking the hub (algorithms.local_paths)."""
    from transformers import AutoConfig

    problem = missing_folder(cfg.model_name, f"{section}.model_name")
    if problem is not None:
        raise SetupError(problem)
    try:
        return AutoConfig.from_pretrained(cfg.model_name)
    except Exception as error:  # noqa: BLE001 - missing files, bad name, no network
        message = f"{section}.model_name: cannot load {cfg.model_name!r}: {error}"
        raise SetupError(message) from error


WEIGHT_FILES = {
    "dtensor": (
        "model.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "pytorch_model.bin.index.json",
    ),
    "megatron": ("model.safetensors", "model.safetensors.index.json"),
}
"""The weight files each backend loads (from_pretrained's; Megatron's reader takes safetensors
only), single or sharded behind an index."""


def check_weights(cfg: PolicyConfig, section: str) -> None:
    """A local model directory holds weights its backend loads, and a sharded checkpoint every
    shard its index lists (a directory of a config alone passed setup and failed in the
    workers). A hub name is left to the download."""
    root = Path(cfg.model_name)
    if not root.is_dir():
        return
    names = WEIGHT_FILES[cfg.backend]
    found = next((root / name for name in names if (root / name).is_file()), None)
    if found is None:
        raise SetupError(
            f"{section}.model_name: {root} has no weights (none of {', '.join(names)}, which the "
            f"{cfg.backend} backend loads): point it at a complete Hugging Face checkpoint"
        )
    if found.name.endswith(".index.json"):
        _check_shards(found, section)


def _check_shards(index: Path, section: str) -> None:
    """Every shard a weights index lists is a file beside it."""
    try:
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        raise SetupError(f"{section}.model_name: cannot read {index}: {error}") from None
    missing = [shard for shard in shards if not (index.parent / shard).is_file()]
    if missing:
        raise SetupError(
            f"{section}.model_name: {index.parent} lacks {missing[0]}, which {index.name} lists "
            f"({len(missing)} of {len(shards)} shards missing): copy the whole checkpoint"
        )


def check_vocab_sizes(
    student: PretrainedConfig, teacher: PretrainedConfig, tokens: int, section: str = "teacher"
) -> None:
    """Both embeddings cover the tokenizer, and the teacher's vocabulary (that of the config's
    `section`: teacher, or teachers.<name>) is not larger than the student's (its top-k ids
    index the student's logits)."""
    for name, config in (("policy", student), (section, teacher)):
        if config.vocab_size < tokens:
            raise SetupError(
                f"{name}.model_name: vocab size {config.vocab_size} is smaller than the "
                f"tokenizer's {tokens} tokens"
            )
    if teacher.vocab_size > student.vocab_size:
        raise SetupError(
            f"{section}: the teacher's vocab size ({teacher.vocab_size}) exceeds the student's "
            f"({student.vocab_size}): teacher top-k ids could fall outside the student's logits"
        )


def check_student_ids_fit_teacher(
    student: PretrainedConfig, teacher: PretrainedConfig, section: str = "teacher"
) -> None:
    """A teacher that reads the student's ids as they are (one tokenizer) has a row for every
    id the student can sample: vLLM samples over all of the student's vocab_size logits, and
    an id past the teacher's embedding failed in its worker, minutes in, as an IndexError
    (check_vocab_sizes refuses the other direction)."""
    if student.vocab_size > teacher.vocab_size:
        raise SetupError(
            f"{section}: the student's vocabulary ({student.vocab_size:,} ids) is larger than "
            f"the teacher's ({teacher.vocab_size:,}), and the teacher reads the student's ids "
            "as they are: the student can write ids the teacher has no embedding row for. Let "
            "each tokenizer follow its model (tokenizer.name: ${..model_name}): a teacher with "
            "another vocabulary then reads the student's text in its own tokens "
            "(docs/cross_tokenizer.md)"
        )


def check_tokenizer_fits(
    tokenizer: PreTrainedTokenizerBase, config: PretrainedConfig, section: str
) -> None:
    """Every id the tokenizer can write (its vocabulary and added special tokens) is a row of
    the model's embedding: an id past them fails in a worker, after start-up, as an IndexError
    (a tokenizer named for another model, often a recipe's inherited with a new model)."""
    ids = max(len(tokenizer), max(tokenizer.get_vocab().values(), default=-1) + 1)
    if ids > config.vocab_size:
        raise SetupError(
            f"{section}.tokenizer.name: the tokenizer writes ids up to {ids - 1:,}, but "
            f"{section}.model_name has {config.vocab_size:,} embedding rows (ids 0 to "
            f"{config.vocab_size - 1:,}): the model cannot read its ids. Use the tokenizer the "
            f"model was trained with: {section}.tokenizer.name follows the model when set to "
            "${..model_name}"
        )


def check_sequence_length(cfg: PolicyConfig, config: PretrainedConfig, section: str) -> None:
    """max_total_sequence_length fits the model's positions (max_position_embeddings): vLLM
    refuses a longer max_model_len when it starts, after the other workers have loaded."""
    positions = getattr(config, "max_position_embeddings", None)
    if isinstance(positions, int | float) and cfg.max_total_sequence_length > positions:
        raise SetupError(
            f"{section}.max_total_sequence_length ({cfg.max_total_sequence_length}) is longer "
            f"than {section}.model_name reads ({int(positions)} positions, its "
            f"max_position_embeddings): set {section}.max_total_sequence_length to at most "
            f"{int(positions)}"
        )


def check_tensor_parallel(cfg: PolicyConfig, config: PretrainedConfig, section: str) -> None:
    """The tensor-parallel size divides the attention heads and the key/value heads (each rank
    holds whole heads). The vocabulary need not divide: the engines pad it."""
    tp = cfg.tensor_parallel_size
    dims = {
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": getattr(config, "num_key_value_heads", None)
        or config.num_attention_heads,
    }
    for name, size in dims.items():
        if size % tp:
            raise SetupError(
                f"{section}: tensor_parallel_size {tp} must divide the model's {name} ({size}); "
                "tensor parallelism gives each rank an equal number of attention heads and of "
                "key/value heads, so it must divide both "
                f"({dims['num_attention_heads']} and {dims['num_key_value_heads']}); "
                "the vocabulary need not divide (it is padded)"
            )


def check_megatron_training_precision(cfg: PolicyConfig, device_type: str) -> None:
    """A Megatron-trained student on CPU must be fp32: megatron-core's linear layers restore
    only CUDA autocast in their backward, so under CPU autocast their bf16 gradients meet fp32
    weights and training fails at the first step (a frozen teacher only runs forward)."""
    if device_type == "cpu" and cfg.backend == "megatron" and cfg.precision != "float32":
        raise SetupError(
            f"policy.precision={cfg.precision} cannot train with the Megatron backend on CPU "
            "(megatron-core's linear layers support autocast training on GPU only); set "
            "policy.precision=float32 (the teacher may keep its precision)"
        )


def check_model_family(cfg: PolicyConfig, config: PretrainedConfig, section: str) -> None:
    """The engines reproduce the model's Hugging Face forward: its output head is one nemo_opd
    knows (models/output_head.py) and its backend expresses, and its attention needs nothing
    the engines' attention leaves out (check_attention)."""
    from nemo_opd.models.output_head import output_head_of  # imports torch

    check_head_family(config, section)
    head = output_head_of(config)
    if cfg.backend == "megatron" and not head.is_plain:
        raise SetupError(
            f"{section}.model_name: the output head of model_type {head.family!r} adds a bias, "
            "scale or soft-cap to h W^T, which the Megatron backend's output layer does not "
            f"apply; use the DTensor backend for {section}"
        )
    check_attention(cfg, config, section)


def check_head_family(config: Any, section: str) -> None:
    """The model's output head is one nemo_opd reproduces (a known model_type, no logit step its
    family does not take: models/head_families.py), read from the config alone (a transformers
    config, or config.json's keys as attributes: the pre-flight's), without torch."""
    try:
        head_fields(config)
    except UnknownHeadError as error:
        raise SetupError(f"{section}.model_name: {error}") from None


def check_attention(cfg: PolicyConfig, config: PretrainedConfig, section: str) -> None:
    """The engines' attention (distributed/context_parallel.py) is causal attention within
    segments: it applies neither an attention-logit soft-cap (Gemma 2) nor a sliding window,
    so a model that has one is refused, the window only where a sequence can outgrow it."""
    cap = getattr(config, "attn_logit_softcapping", None)
    if cap is not None:
        raise SetupError(
            f"{section}.model_name: model_type {config.model_type!r} soft-caps its attention "
            f"logits (attn_logit_softcapping={cap}), which the engines' attention does not "
            "apply: its log-probs would be wrong; use a model without it"
        )
    window = getattr(config, "sliding_window", None)
    if window is not None and cfg.max_total_sequence_length > window:
        raise SetupError(
            f"{section}.model_name: model_type {config.model_type!r} attends within a sliding "
            f"window of {window} positions, which the engines' attention does not apply; set "
            f"{section}.max_total_sequence_length to at most {window}"
        )
