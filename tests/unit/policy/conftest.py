"""Fixtures: tiny random Qwen3 models on disk (the helpers that build them, configs, policies
and batches are tests/tiny_policies.py). A module's Ray is tests/conftest.py's ray_session
(RAY_CPUS: its logical CPUs, 2 by default; RAY_CPUS_EXACT: no more than that)."""

import pytest
from tiny_policies import ODD_VOCAB, save_tiny_model


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    """{"tied": dir, "untied": dir, "odd_tied": dir, "odd_untied": dir} of tiny random Qwen3
    models (vocabulary VOCAB, or ODD_VOCAB for the odd_* ones)."""
    root = tmp_path_factory.mktemp("tiny_models")
    return {
        "tied": save_tiny_model(root / "tied", True, seed=1),
        "untied": save_tiny_model(root / "untied", False, seed=2),
        "odd_tied": save_tiny_model(root / "odd_tied", True, seed=3, vocab=ODD_VOCAB),
        "odd_untied": save_tiny_model(root / "odd_untied", False, seed=4, vocab=ODD_VOCAB),
    }
