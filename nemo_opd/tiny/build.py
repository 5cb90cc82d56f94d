"""Build the tiny assets of one recipe into a directory: data, tokenizer, teacher, student.

Layout written under ``out_dir``::

    data/train.jsonl, data/validation.jsonl
    tokenizer/            PreTrainedTokenizerFast with the chat template
    teacher/, student/    save_pretrained models (safetensors, generation_config.json) plus a
                          copy of the tokenizer, so each loads alone (transformers or vLLM)
    manifest.json         written last: recipe, accuracies, timings, versions

The caller (``assets.py``) makes the directory appear atomically.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path

import tokenizers
import torch
import transformers
from transformers import PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

import nemo_opd
from nemo_opd.tiny.evaluation import heldout_accuracy
from nemo_opd.tiny.model import build_tiny_model, count_parameters
from nemo_opd.tiny.recipe import (
    MANIFEST,
    ModelRecipe,
    TinyRecipe,
    TrainRecipe,
    recipe_key,
    recipe_roles,
    role_key,
)
from nemo_opd.tiny.sft import SFTExample, encode_sft_examples, train_sft
from nemo_opd.tiny.task import write_data_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer
from nemo_opd.tiny.tool_task import corpus_texts, encode_tool_examples, tool_accuracy


@contextmanager
def quiet_progress_bars() -> Iterator[None]:
    """Hide transformers' progress bars (e.g. "Writing model shards"); the build logs its own."""
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run with exactly ``n`` intra-op threads, then restore the previous count."""
    previous = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def build_model_role(
    role: str,
    recipe: TinyRecipe,
    tokenizer: PreTrainedTokenizerBase,
    examples: list[SFTExample],
    validation: list[dict],
    out_dir: Path,
    log: Callable[[str], None],
) -> dict:
    """Initialize, train, evaluate and save the ``role`` model ("teacher" or "student") into
    ``out_dir / role``; returns its manifest entry."""
    model_recipe: ModelRecipe = getattr(recipe, role)
    train_recipe: TrainRecipe = getattr(recipe, f"{role}_train")
    model = build_tiny_model(model_recipe, tokenizer, seed=train_recipe.seed)
    n_params = count_parameters(model)
    log(f"{role}: {n_params:,} parameters, {train_recipe.steps} steps of {train_recipe.batch_size}")
    result = train_sft(model, examples, train_recipe, tokenizer.pad_token_id, log, name=role)
    start = time.perf_counter()
    accuracy = heldout_accuracy(
        model, tokenizer, validation, recipe.eval_batch_size, recipe.eval_max_new_tokens
    )
    eval_seconds = time.perf_counter() - start
    log(f"{role}: held-out accuracy {accuracy:.1%} ({eval_seconds:.1f}s)")
    model.save_pretrained(out_dir / role)
    tokenizer.save_pretrained(out_dir / role)
    entry = {
        "parameters": n_params,
        "heldout_accuracy": accuracy,
        "final_train_loss": result.final_loss,
        "train_seconds": round(result.seconds, 2),
        "eval_seconds": round(eval_seconds, 2),
        "trained_tokens": result.trained_tokens,
    }
    if recipe.tools is not None:
        with_tools = tool_accuracy(model, tokenizer, validation, recipe, with_tools=True)
        log(f"{role}: with the calculator offered {with_tools}")
        entry["heldout_accuracy_tools"] = with_tools.pop("accuracy")
        entry.update(with_tools)
    return entry


def versions() -> dict[str, str]:
    """Versions that decide the bytes of a build."""
    return {
        "nemo_opd": nemo_opd.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
    }


def reusable_role(recipe: TinyRecipe, role: str, cache: Path) -> Path | None:
    """A complete build in `cache` (a directory of builds) whose `role` model is the one
    `recipe` would train (the same role key, recipe.role_key, and the same versions), or
    None."""
    wanted = role_key(asdict(recipe), role)
    for manifest_file in sorted(cache.glob(f"*/{MANIFEST}")):
        try:
            manifest = json.loads(manifest_file.read_text())
            same = role_key(manifest["recipe"], role) == wanted
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if same and manifest.get("versions") == versions() and role in manifest["models"]:
            return manifest_file.parent
    return None


def copy_role(source: Path, role: str, out_dir: Path, log: Callable[[str], None]) -> dict:
    """The `role` model of the build at `source`, copied into out_dir; its manifest entry,
    marked with where it came from."""
    shutil.copytree(source / role, out_dir / role)
    entry = json.loads((source / MANIFEST).read_text())["models"][role]
    log(f"{role}: the same as in the build {source.name}, copied (not trained again)")
    return {**entry, "copied_from": source.name}


def build_tiny_assets(
    recipe: TinyRecipe, out_dir: Path, log: Callable[[str], None] = print, reuse: bool = True
) -> dict:
    """Build everything into ``out_dir`` (which must exist) and return the manifest. With
    `reuse`, a model that a complete build beside out_dir already trained from the same
    inputs (reusable_role) is copied from it instead of trained again."""
    start = time.perf_counter()
    timings: dict[str, float] = {}
    with torch_threads(recipe.torch_threads), quiet_progress_bars():
        # 1. data: both splits, as jsonl
        splits = write_data_splits(recipe.task, out_dir)
        timings["data"] = time.perf_counter() - start
        log(f"data: {len(splits['train']):,} train, {len(splits['validation']):,} held-out")

        # 2. tokenizer, trained on the first train records; then the train split is encoded
        #    once for both models
        phase = time.perf_counter()
        tok = recipe.tokenizer
        first = splits["train"][: tok.num_train_records]
        tokenizer = build_tiny_tokenizer(
            first,
            tok.vocab_size,
            tok.min_frequency,
            tok.model_max_length,
            tok.chat_style,
            extra_texts=corpus_texts(first) if recipe.tools is not None else (),
        )
        tokenizer.save_pretrained(out_dir / "tokenizer")
        examples = None if recipe.tools else encode_sft_examples(splits["train"], tokenizer)
        timings["tokenizer"] = time.perf_counter() - phase
        log(f"tokenizer: {len(tokenizer)} tokens")

        # 3. teacher and student, each trained, evaluated and saved (the tool task's
        #    conversations differ by role)
        models = {}
        for role in recipe_roles(recipe):
            phase = time.perf_counter()
            source = reusable_role(recipe, role, out_dir.parent) if reuse else None
            if source is not None:
                models[role] = copy_role(source, role, out_dir, log)
            else:
                if recipe.tools is not None:
                    examples = encode_tool_examples(splits["train"], tokenizer, role, recipe)
                models[role] = build_model_role(
                    role, recipe, tokenizer, examples, splits["validation"], out_dir, log
                )
            timings[role] = time.perf_counter() - phase
    timings["total"] = time.perf_counter() - start

    # 4. manifest, last: its presence marks a complete build
    manifest = {
        "key": recipe_key(recipe),
        "build_id": uuid.uuid4().hex,
        "built_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "recipe": asdict(recipe),
        "vocab_size": len(tokenizer),
        "models": models,
        "timings_seconds": {name: round(t, 2) for name, t in timings.items()},
        "versions": versions(),
        "machine": {"platform": sys.platform, "arch": platform.machine(), "cpus": os.cpu_count()},
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
