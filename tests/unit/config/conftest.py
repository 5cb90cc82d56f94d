"""Shared fixtures: a small valid config (as a dict) and a helper to write YAML files."""

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

_MINIMAL: dict[str, Any] = {
    "policy": {
        "model_name": "tiny:student",
        "tokenizer": {"name": "tiny:tokenizer"},
        "precision": "float32",
        "train_global_batch_size": 8,
        "train_micro_batch_size": 2,
        "max_total_sequence_length": 64,
        "optimizer": {"lr": 1.0e-3},
        "generation": {"max_new_tokens": 32, "vllm_cfg": {"max_model_len": 64}},
    },
    "teacher": {
        "model_name": "tiny:teacher",
        "tokenizer": {"name": "tiny:tokenizer"},
        "precision": "float32",
        "max_total_sequence_length": 64,
    },
    "distillation": {
        "num_prompts_per_step": 4,
        "num_generations_per_prompt": 2,
        "max_num_steps": 3,
    },
    "data": {"dataset_name": "tiny_math"},
    "cluster": {"num_nodes": 1, "gpus_per_node": 2, "device": "cpu"},
    "checkpointing": {"enabled": False},
}


@pytest.fixture
def minimal() -> dict[str, Any]:
    """A fresh copy of a small config that passes every check (2 CPU workers, DTensor)."""
    return copy.deepcopy(_MINIMAL)


@pytest.fixture
def write_yaml(tmp_path: Path) -> Callable[[str, Any], Path]:
    """write_yaml(name, content) writes text (str) or data (dumped as YAML) under tmp_path."""

    def write(name: str, content: Any) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        text = content if isinstance(content, str) else yaml.safe_dump(content, sort_keys=False)
        path.write_text(text, encoding="utf-8")
        return path

    return write
