"""Building a distillation run: everything the loop (algorithms/distillation.py) drives.

    setup(cfg) -> DistillationRun

The steps, in order (docs/benchmarks.md has the start-up profile), each built by a module of
its own:
    1. directories  claim the checkpoint and log directories (one run per checkpoint
                    directory; run_dirs, run_identity)
    2. models       resolve the tiny assets, check tokenizers and model configs against each
                    other, reach a served teacher and check it (setup_models, setup_teachers)
    3. executor     Ray actors or one process (cluster.executor: config.executor.run_executor);
                    under Ray, start it and reserve one placement bundle per worker on the
                    chosen nodes, checked to see the run's paths (setup_workers)
    4. workers      start the environments' grader processes; read and render the data, and
                    tokenize it in a thread while vLLM, whose start-up is the longest, loads
                    (prompts, setup_generation); launch the student's and the teachers'
                    workers (setup_teachers); wait for them all, each wait with a time-out
    5. the run      the losses (objective), the checkpoints; restore the newest checkpoint
                    that verifies (resume)
    6. report       start-up times and placement; the logger
When anything fails, what was already started is shut down and the directories released.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import torch

from nemo_opd.algorithms.model_checks import check_megatron_training_precision
from nemo_opd.algorithms.objective import build_loss, distillation_loss, print_temperatures
from nemo_opd.algorithms.prompts import start_loading_prompts
from nemo_opd.algorithms.resume import restore_latest
from nemo_opd.algorithms.run_state import DistillationRun
from nemo_opd.algorithms.setup_generation import build_generation, build_teacher_sampler
from nemo_opd.algorithms.setup_models import check_models, resolve_model_paths
from nemo_opd.algorithms.setup_teachers import (
    privileged_context,
    self_teacher,
    served_teacher,
    start_teachers,
    with_privileged_context,
)
from nemo_opd.algorithms.setup_workers import (
    SHARE,
    collect_startup,
    describe_workers,
    is_served,
    local_threads,
    overlap_threads,
    report_placement,
    reserve_workers,
    wait_for_workers,
    with_executor,
)
from nemo_opd.config import DistillationConfig
from nemo_opd.config.checks import overlap_problem
from nemo_opd.config.worker_split import WorkerSplit, worker_split
from nemo_opd.data.prompt_loader import PromptLoader
from nemo_opd.distributed.cluster import (
    check_machine_gpus,
    describe_device,
    gpus_seen,
    release_placement,
    resolve_device_type,
)
from nemo_opd.environments.build import build_environments, wait_for_environments
from nemo_opd.errors import SetupError
from nemo_opd.policy.policy import Policy
from nemo_opd.utils.checkpoint_manager import CheckpointManager
from nemo_opd.utils.gc_pause import collection_paused
from nemo_opd.utils.logger import Logger
from nemo_opd.utils.run_dirs import RunLock, check_writable, with_absolute_paths
from nemo_opd.utils.run_identity import check_run_folders, record_log_owner, run_identity
from nemo_opd.utils.startup import StartupMarks, format_startup_report
from nemo_opd.utils.text_width import wrapped
from nemo_opd.utils.worker_output import WORKERS_LOG, start_up_output_to


def setup(cfg: DistillationConfig) -> DistillationRun:
    """Claim the output directories (step 1), then build everything (_build_run); the
    directories are released again if building fails."""
    # 1. directories: the checkpoint and log directories, this run's alone
    marks = StartupMarks()
    cfg = with_absolute_paths(cfg)  # the workers' working directory is not the driver's
    lock = _claim_directories(cfg)
    try:
        with collection_paused():  # what setup builds lives as long as the run (gc_pause)
            return _build_run(cfg, lock, marks)
    except BaseException:
        lock.release()
        raise


def _claim_directories(cfg: DistillationConfig) -> RunLock:
    """This run alone uses checkpointing.checkpoint_dir (a lock held until shutdown), it and
    logger.log_dir can be written, and neither holds another run's checkpoints or metrics
    (run_identity.check_run_folders): checked before anything starts. The lock carries the
    run's identity, which its checkpoints record."""
    lock = RunLock(cfg.checkpointing.checkpoint_dir)
    note = lock.acquire()
    if note:
        print(f"checkpoints: {note}")
    try:
        check_writable(cfg.checkpointing.checkpoint_dir, "checkpointing.checkpoint_dir")
        check_writable(cfg.logger.log_dir, "logger.log_dir")
        check_run_folders(cfg)
        record_log_owner(cfg)
    except SetupError:
        lock.release()
        raise
    lock.identity = run_identity(cfg)
    return lock


def _build_run(cfg: DistillationConfig, lock: RunLock, marks: StartupMarks) -> DistillationRun:
    """Steps 2 to 6 of the module docstring: build tokenizer, data, environments, student,
    teacher, generation, loss and logging, and restore the newest checkpoint that verifies, if
    there is one. `marks` gets the driver's start-up times. When anything fails, the parts
    already started are shut down."""
    # 2. models: "tiny:*" names build (or reuse) the embedded assets here, once, on the driver
    cfg = resolve_model_paths(cfg)
    tokenizer, renderings = check_models(cfg)
    served = served_teacher(cfg, tokenizer) if is_served(cfg) else None
    # 3. executor: cluster.executor "ray" or "local" from here on; Ray's placement group
    cfg, device, split = _choose_executor(cfg, marks)
    placement = reserve_workers(cfg, device) if cfg.cluster.executor == "ray" else None
    # 4. workers: the graders' processes, the data's rendering, then vLLM, which loads while
    # the data are tokenized; then student and teachers
    started = [] if served is None else [served]  # a served teacher's render workers
    try:
        with _workers_output(cfg):
            environments = build_environments(cfg.env, wait=False)  # start while vLLM loads
            started.extend(environments.values())
            prompts = start_loading_prompts(cfg, tokenizer)
            marks.note("prompts_rendered")
            generation = build_generation(cfg, device, split, placement)
            started.append(generation)
            teacher_sampler = build_teacher_sampler(cfg, device, split, placement)
            if teacher_sampler is not None:
                started.append(teacher_sampler)
            marks.note("vllm_launched")
            formatter, train, val = prompts()
            context = privileged_context(cfg, formatter, [train, val])
            marks.note("data")
            student = Policy(
                cfg.policy,
                cfg.cluster,
                num_workers=split.training,
                name="policy",
                total_steps=cfg.distillation.max_num_steps * _optimizer_steps_per_step(cfg),
                placement=placement,
                share=SHARE,
                wait=False,
                threads=overlap_threads(cfg, device),
                executor=cfg.cluster.executor,
            )
            started.append(student)
            teacher = served
            if served is None and cfg.named_teachers:
                threads = overlap_threads(cfg, device)
                teacher = start_teachers(cfg, renderings, split.training, placement, threads)
                started.append(teacher)
            own = self_teacher(cfg, student)  # teacher.source student, ema or lagged
            teacher = with_privileged_context(own or teacher, context, formatter)
            marks.note("workers_launched")
            wait_for_workers(marks, student, teacher, generation, teacher_sampler)
            # generating from the student's module: the refit copies nothing
            if generation.shares_student:
                generation.share_module(student.local_module())
            wait_for_environments(environments)
            marks.note("environments_ready")
            if own is not None:  # the student's workers hold the teacher's weights
                own.start(cfg.self_teacher)
            elif cfg.loss_fn.support != "teacher_topk":  # the student applies the teacher's head
                student.load_teacher_head(cfg.teacher.model_name, cfg.teacher.precision)
    except BaseException:
        for part in started:
            part.shutdown()
        if placement is not None:
            release_placement(placement)
        raise
    print_temperatures(cfg)

    # 5. the run: losses, checkpoints, and the newest checkpoint that verifies
    run_state = DistillationRun(
        cfg=cfg,
        formatter=formatter,
        train_prompts=train,
        val_prompts=val,
        loader=PromptLoader(
            train.samples,
            cfg.distillation.num_prompts_per_step,
            cfg.data.shuffle,
            cfg.distillation.seed,
        ),
        environments=environments,
        student=student,
        teacher=teacher,
        generation=generation,
        loss_fn=build_loss(cfg),
        val_loss_fn=distillation_loss(cfg) if teacher else None,
        logger=None,
        checkpoints=CheckpointManager(cfg.checkpointing),
        placement=placement,
        lock=lock,
        teacher_sampler=teacher_sampler,
    )
    restore_latest(run_state)
    marks.note("setup_done")
    # 6. report: start-up times and placement, then the logger (at the resumed step)
    run_state.startup = collect_startup(marks, student, teacher, generation, teacher_sampler)
    run_state.started_at = marks.as_dict()["process"]
    print(format_startup_report(marks.as_dict()["process"], run_state.startup))
    report_placement(cfg, student, teacher, generation, teacher_sampler)
    run_state.logger = Logger(
        cfg.logger,
        run_config=cfg.model_dump(mode="json"),
        resume_step=run_state.step,
        total_steps=cfg.distillation.max_num_steps,
    )
    return run_state


def _workers_output(cfg: DistillationConfig) -> AbstractContextManager:
    """Where the workers' start-up output goes: without Ray, logger.log_dir's workers.log
    (utils/worker_output.py; a process of the processes executor keeps writing there), as
    each Ray worker's goes to its own log files."""
    if cfg.cluster.executor == "ray":
        return nullcontext()
    return start_up_output_to(Path(cfg.logger.log_dir) / WORKERS_LOG)


def _choose_executor(
    cfg: DistillationConfig, marks: StartupMarks
) -> tuple[DistillationConfig, str, WorkerSplit]:
    """The config with cluster.executor resolved (Ray started under "ray"), the device type and
    the split of workers, printed; SetupError for a device the config cannot overlap on."""
    cfg = with_executor(cfg)
    executor = cfg.cluster.executor
    if executor == "ray":
        from nemo_opd.distributed.ray_runtime import init_ray

        init_ray(cfg.cluster)  # the command line has started it already
        marks.note("ray")
    split = worker_split(cfg.cluster, cfg.policy.generation)
    device = resolve_device_type(cfg.cluster, executor)
    if executor == "local":
        torch.set_num_threads(local_threads(cfg, device))
    gpus = gpus_seen(executor)
    print(wrapped(describe_device(cfg.cluster, device, gpus, executor)))
    if executor != "ray" and device == "cuda":  # Ray's placement group checks its own
        check_machine_gpus(cfg.cluster.world_size, gpus, executor)
    print(wrapped(describe_workers(cfg, device, split)))
    check_megatron_training_precision(cfg.policy, device)
    cannot_overlap = overlap_problem(cfg, device)
    if cannot_overlap:
        raise SetupError(cannot_overlap)
    return cfg, device, split


def rollouts_per_step(cfg: DistillationConfig) -> int:
    """Conversations sampled per step: prompts x generations per prompt."""
    return cfg.distillation.num_prompts_per_step * cfg.distillation.num_generations_per_prompt


def _optimizer_steps_per_step(cfg: DistillationConfig) -> int:
    return rollouts_per_step(cfg) // cfg.policy.train_global_batch_size
