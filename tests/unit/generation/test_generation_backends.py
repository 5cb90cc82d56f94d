"""policy.generation.backend: which worker class serves generation, with which settings."""

import importlib.util

import pytest
from pydantic import ValidationError
from vllm_testing import generation_config

from nemo_opd.errors import SetupError
from nemo_opd.generation import backends
from nemo_opd.generation.hf_worker import HfWorker
from nemo_opd.generation.vllm_worker import VllmWorker


def test_the_key_takes_auto_vllm_or_transformers_and_defaults_to_auto():
    assert generation_config().backend == "auto"
    for name in ("auto", "vllm", "transformers"):
        assert generation_config(backend=name).backend == name
    with pytest.raises(ValidationError, match="'auto', 'vllm' or 'transformers'"):
        generation_config(backend="hf")


def test_each_backend_gets_its_worker_and_its_own_settings():
    cfg = generation_config(backend="transformers", transformers_cfg={"max_batch_tokens": 512})
    assert backends.engine_worker(cfg) == (
        HfWorker,
        {"precision": "bfloat16", "max_batch_tokens": 512},
    )
    if importlib.util.find_spec("vllm") is not None:
        cfg = generation_config(backend="vllm")
        assert backends.engine_worker(cfg) == (VllmWorker, cfg.vllm_cfg.model_dump())


def test_auto_is_vllm_where_it_is_installed_else_transformers(monkeypatch):
    installed = importlib.util.find_spec("vllm") is not None
    assert backends.resolve_backend("auto") == ("vllm" if installed else "transformers")
    monkeypatch.setattr(backends, "vllm_installed", lambda: False)
    assert backends.resolve_backend("auto") == "transformers"
    assert backends.resolve_backend("transformers") == "transformers"
    with pytest.raises(SetupError, match="backend is vllm, but the vllm package is not installed"):
        backends.resolve_backend("vllm")


def test_the_engine_shares_the_students_module_only_where_it_may(monkeypatch):
    """One process, lockstep, the DTensor engine, the student's precision, the transformers
    backend: anything else (or share_student false) keeps a copy that refit fills."""
    from pathlib import Path

    from nemo_opd.config import load_config

    monkeypatch.setattr(backends, "vllm_installed", lambda: False)  # auto: transformers
    tiny = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"
    sharing = ("cluster.executor=local", "distillation.max_staleness=0")

    def shares(*overrides: str) -> bool:
        return backends.shares_student_module(load_config(tiny, [*sharing, *overrides]))

    assert shares()
    assert not shares("policy.generation.transformers_cfg.share_student=false")
    assert not shares("cluster.executor=ray")
    assert not shares("distillation.max_staleness=1")
    assert not shares("policy.generation.transformers_cfg.precision=bfloat16")  # fp32 student
    assert not shares("policy.dtensor_cfg.enabled=false", "policy.megatron_cfg.enabled=true")
    assert shares("policy.generation.backend=auto")  # auto: transformers here
    monkeypatch.setattr(backends, "vllm_installed", lambda: True)  # auto: vllm
    assert not shares("policy.generation.backend=auto")
    assert shares()  # the tiny default's own engine: transformers wherever vLLM is
