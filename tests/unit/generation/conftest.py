"""Fixtures: tiny random Qwen3 checkpoints and one local Ray instance per test module."""

import pytest
from vllm_testing import save_tiny_model


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """{"a": dir, "b": dir}: two tiny tied-embedding Qwen3 models with different weights."""
    root = tmp_path_factory.mktemp("tiny_vllm_models")
    return {"a": save_tiny_model(root / "a", seed=1), "b": save_tiny_model(root / "b", seed=2)}


@pytest.fixture(scope="module")
def ray_session():
    """A 2-CPU Ray instance like the CPU CI machine's."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()
