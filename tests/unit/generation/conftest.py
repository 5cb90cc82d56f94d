"""Fixtures: tiny random Qwen3 checkpoints (a module's Ray is tests/conftest.py's ray_session, with
at least 2 CPUs, like the CPU CI machine)."""

import pytest
from vllm_testing import save_tiny_model


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """{"a": dir, "b": dir}: two tiny tied-embedding Qwen3 models with different weights."""
    root = tmp_path_factory.mktemp("tiny_vllm_models")
    return {"a": save_tiny_model(root / "a", seed=1), "b": save_tiny_model(root / "b", seed=2)}
