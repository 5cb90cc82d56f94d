"""Where a run's workers go and how they start: the executor (Ray actors or one process), the
placement group of a Ray run, the threads each process computes on, the one-line description
of the workers before they start, the wait for them (each with a time-out) and, once they have
started, their start-up times and where Ray placed them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from nemo_opd.config import DistillationConfig
from nemo_opd.config.executor import is_served, run_executor, uses_ray
from nemo_opd.config.worker_split import WorkerSplit
from nemo_opd.distributed.cluster import WorkerResources, build_placement_group
from nemo_opd.distributed.placement import bundle_node_slots, generation_bundles
from nemo_opd.generation import VllmGeneration
from nemo_opd.generation.backends import ENGINE_NAMES, resolve_backend, shares_student_module
from nemo_opd.policy.policy import Policy
from nemo_opd.teachers.base import Teacher
from nemo_opd.utils.startup import StartupMarks

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

PLACEMENT_FILE = "placement.json"
"""Where Ray placed the run's workers (nodes.placement_record), in logger.log_dir."""
SHARE = 1 / 3
"""Fraction of each training bundle (CPUs, GPU) taken by the student, the teacher and colocated
generation: they run one after another within a step, so they share the devices."""


def overlap_threads(cfg: DistillationConfig, device: str, cores: int | None = None) -> int | None:
    """Threads of a CPU process that holds `cores` (default cluster.cpus_per_worker) when
    max_staleness > 0: half of them, at least 1, since generation, the teacher and training
    then run at once on the same cores (each on its full share, their OpenMP threads would
    spin against each other: docs/benchmarks.md has the tiny step's time). None otherwise
    (all of them)."""
    if device != "cpu" or cfg.distillation.max_staleness == 0:
        return None
    return max(1, (cores or cfg.cluster.cpus_per_worker) // 2)


def local_threads(cfg: DistillationConfig, device: str) -> int:
    """torch threads of a run in one process (the local executor), set once for the process
    (torch.set_num_threads is process-wide): what one Ray worker of the same config computes
    on, cluster.cpus_per_worker, or half of it under overlap (overlap_threads), since there
    training and the rollout producer's generation and teacher compute at once in two of the
    process's threads. The same count as the Ray run's every worker and engine, so the two
    executors' runs compute alike."""
    return overlap_threads(cfg, device) or cfg.cluster.cpus_per_worker


def with_executor(cfg: DistillationConfig) -> DistillationConfig:
    """The config with cluster.executor resolved (auto -> ray or local: run_executor), so that
    every part, and the config the run logs, names the executor that runs it."""
    cluster = cfg.cluster.model_copy(update={"executor": run_executor(cfg)})
    return cfg.model_copy(update={"cluster": cluster})


def reserve_workers(cfg: DistillationConfig, device: str) -> PlacementGroup:
    """The placement group of the run: cluster.num_nodes nodes chosen (SetupError when the
    cluster lacks them), checked to see the paths the workers use, and one bundle per worker
    pinned to its node (placement.bundle_node_slots)."""
    from nemo_opd.distributed.nodes import choose_nodes  # Ray's (a run in one process has none)
    from nemo_opd.distributed.shared_paths import check_shared_paths, paths_workers_use

    resources = WorkerResources(device, cfg.cluster.cpus_per_worker)
    nodes = choose_nodes(cfg.cluster, resources)
    check_shared_paths(paths_workers_use(cfg), nodes)
    slots = bundle_node_slots(cfg.cluster)
    return build_placement_group(len(slots), resources, nodes=[nodes[s].node_id for s in slots])


def describe_workers(cfg: DistillationConfig, device: str, split: WorkerSplit) -> str:
    """One line for the start of a run: the workers it is about to place (the training workers
    and what runs on them, the vLLM engines and where); report_placement says where Ray put
    each once they have started."""
    engines = len(generation_bundles(cfg.cluster, split, cfg.policy.generation, device))
    engine = ENGINE_NAMES[resolve_backend(cfg.policy.generation.backend)]
    teachers = cfg.named_teachers and not is_served(cfg)
    if cfg.cluster.executor == "local":
        teacher = (
            ("the teacher, " if cfg.teachers is None else "each teacher, ") if teachers else ""
        )
        shared = " generating from the student's module" if shares_student_module(cfg) else ""
        return (
            f"workers: one process (cluster.executor local, no Ray): the student, {teacher}"
            f"{_count(engines, engine)}{shared} on {_count(torch.get_num_threads(), 'thread')}"
        )
    models = "the student"
    if teachers:
        models += " and of the teacher" if cfg.teachers is None else " and of each teacher"
    if device == "cpu":
        where = "sharing the training workers' CPUs"
    elif cfg.policy.generation.colocated.enabled:
        where = "colocated: each shares a training worker's GPU"
    else:
        where = "on GPUs of their own"
    if cfg.cluster.executor == "processes":
        placed = "each a process of this machine (cluster.executor processes, no Ray)"
    else:
        placed = "where Ray placed each is printed once they have started"
    return (
        f"workers: {_count(split.training, 'training worker')} (each runs a rank of {models}) "
        f"on {_count(cfg.cluster.num_nodes, 'node')}, {_count(engines, engine)} "
        f"({where}); {placed}"
    )


def _count(number: int, noun: str) -> str:
    """'1 node', '2 nodes'."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _named_parts(
    student: Policy,
    teacher: Teacher | None,
    generation: VllmGeneration | None,
    teacher_sampler: VllmGeneration | None,
) -> list[tuple[str, object]]:
    """(name, part) of what a run starts, in the order student, the teacher's workers (by their
    part names), vLLM, the teacher's vLLM (seq_kd); the parts it did not start (None) left
    out."""
    teachers = teacher.workers() if teacher is not None else {}
    parts = [("policy", student), *teachers.items()]
    parts += [("vllm", generation), ("teacher_vllm", teacher_sampler)]
    return [(name, part) for name, part in parts if part is not None]


def wait_for_workers(marks: StartupMarks, *parts) -> None:
    """Block until every part (_named_parts' arguments) has started, marking each."""
    for name, part in _named_parts(*parts):
        part.wait_until_ready()
        marks.note(f"{name}_ready")


def collect_startup(marks: StartupMarks, *parts) -> dict[str, dict[str, float]]:
    """{"driver": ..., "policy.<rank>": ..., "teacher.<rank>": ..., "vllm.<engine>": ...,
    "teacher_vllm.<engine>": ...} for _named_parts' arguments."""
    processes = {"driver": marks.as_dict()}
    for name, part in _named_parts(*parts):
        for index, worker in enumerate(part.startup_marks()):
            processes[f"{name}.{index}"] = worker
    return processes


def report_placement(cfg: DistillationConfig, *parts: Policy | VllmGeneration | None) -> None:
    """Print where Ray placed every worker (_named_parts' order) and write it to
    logger.log_dir/placement.json; a run without Ray (every worker on this machine) has nothing
    to report."""
    if not uses_ray(cfg.cluster.executor):
        return
    from nemo_opd.distributed.nodes import format_placement, placement_record  # Ray's

    record = placement_record({name: part.nodes() for name, part in _named_parts(*parts)})
    print(format_placement(record))
    log_dir = Path(cfg.logger.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / PLACEMENT_FILE).write_text(json.dumps(record, indent=2) + "\n")
