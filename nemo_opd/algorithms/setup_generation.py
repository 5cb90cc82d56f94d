"""The run's vLLM engines: the student's (sampling the rollouts, refit with its weights) and,
with distillation.seq_kd, the teacher's (sampling the off-policy steps' responses)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from nemo_opd.algorithms.setup_workers import SHARE, overlap_threads
from nemo_opd.config import DistillationConfig, PolicyConfig
from nemo_opd.config.worker_split import WorkerSplit
from nemo_opd.distributed.placement import generation_bundles
from nemo_opd.errors import SetupError
from nemo_opd.generation import VllmGeneration
from nemo_opd.generation.backends import shares_student_module

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


def build_generation(
    cfg: DistillationConfig,
    device: str,
    split: WorkerSplit,
    placement: PlacementGroup | None,
    model: PolicyConfig | None = None,
) -> VllmGeneration:
    """vLLM engines holding the student's initial weights (or `model`'s: the teacher's, for
    distillation.seq_kd; never refit), in the placement's generation bundles
    (placement.generation_bundles). On CUDA: one per generation worker, a third of a training
    bundle when colocated (next to student and teacher), a whole bundle of its own otherwise.
    On CPU: one per node that generates, with no reservation, on as many threads as the
    training workers of a node hold CPUs (it time-shares the cores with training, which waits
    while it generates), half of them with max_staleness > 0 (overlap_threads). The student's
    engine in its own process loads no copy where it can generate from the student's module
    (shares_student_module; setup hands it over once the student has started)."""
    gen_cfg = cfg.policy.generation
    colocated = device == "cuda" and gen_cfg.colocated.enabled
    cores = cfg.cluster.cpus_per_worker * cfg.cluster.gpus_per_node
    share_student = model is None and shares_student_module(cfg)
    model = model or cfg.policy
    bundles = generation_bundles(cfg.cluster, split, gen_cfg, device)
    return VllmGeneration(
        gen_cfg,
        model.model_name,
        model.tokenizer.name,
        device_type=device,
        num_engines=len(bundles),
        seed=cfg.distillation.seed,
        cpus_per_engine=cfg.cluster.cpus_per_worker * SHARE if colocated else None,
        cpu_threads=overlap_threads(cfg, device, cores) or cores,
        gpus_per_engine=SHARE if colocated else None,
        placement=placement,
        bundles=bundles,
        wait=False,
        executor=cfg.cluster.executor,
        share_student=share_student,
    )


def build_teacher_sampler(
    cfg: DistillationConfig, device: str, split: WorkerSplit, placement: PlacementGroup | None
) -> VllmGeneration | None:
    """With distillation.seq_kd, vLLM holding the teacher (like the student's engines, with its
    generation settings). SetupError on CUDA: colocated generation has no room for a second
    engine beside training, and non-colocated generation's bundles hold one GPU engine each,
    so the teacher's engine would wait for a device forever."""
    if not cfg.distillation.seq_kd:
        return None
    if device == "cuda":
        raise SetupError(
            "distillation.seq_kd needs a second vLLM engine (the teacher's) beside the "
            "student's, and on GPUs this version has no devices to place it on (colocated "
            "generation has no room beside training; non-colocated generation's devices each "
            "hold one of the student's engines); run seq_kd on CPU, or train on the dataset's "
            "responses instead (distillation.lmbda < 1 with data.response_key)"
        )
    return build_generation(cfg, device, split, placement, cfg.teacher)
