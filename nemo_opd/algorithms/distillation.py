"""On-policy distillation: the student samples, the frozen teacher grades every token, and the
student is trained to match the teacher on the states it visited.

    run(cfg)  =  setup(cfg)  ->  distillation_train(run)  ->  export the final student

One step of distillation_train, in order:
    1. refit     push the student's weights into vLLM, only when they changed
    2. rollout   run_multi_turn_rollout over the math environment; or, on an off-policy step
                 (distillation.lmbda < 1, objective.loss sft), the dataset's responses
                 (reference_rollout) or the teacher's samples (distillation.seq_kd), without
                 refit
    3. flatten   message logs -> input_ids, input_lengths, token_mask, sample_mask
    4. teacher   what the objective uses: top-k log-probs and ids of every position, and/or
                 the log-prob of every sampled token (no teacher at all for reward-only RL);
                 with several teachers, each row is scored by its prompt's (RoutedTeachers)
    5. advantage (objective.loss policy_gradient) the student's log-probs before the update,
                 vLLM's sampling log-probs, and the advantages (nemo_opd.algorithms.advantages)
    6. train     student.train with the objective's loss (DistillationLossFn or
                 PolicyGradientLossFn; one optimizer step per global batch)
    7. validate  every val_period steps: greedy accuracy, avg@k, average length, validation KL
    8. save/log  checkpoint every save_period steps; metrics to console, JSONL, TensorBoard

Resuming is automatic: when checkpointing.checkpoint_dir holds a checkpoint, the student,
optimizer, data position and step are restored, and sampling seeds depend only on (seed, step),
so the resumed run continues exactly as an uninterrupted one would.

Left out on purpose, for now: overlapping generation with teacher scoring, and asynchronous
rollouts.
"""

from __future__ import annotations

import json
import signal
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import ray
import torch
from ray.util.placement_group import PlacementGroup
from transformers import PreTrainedTokenizerBase

from nemo_opd.algorithms.advantages import compute_advantages, group_ids_for
from nemo_opd.algorithms.data_mix import is_on_policy_step, on_policy_share
from nemo_opd.algorithms.model_checks import (
    check_megatron_training_precision,
    check_tensor_parallel,
    check_vocab_sizes,
    load_model_config,
)
from nemo_opd.algorithms.prompts import (
    PromptSet,
    check_fills_one_batch,
    encode_prompts,
    repeat_samples,
)
from nemo_opd.algorithms.tokenizers import check_same_vocabulary, load_tokenizer
from nemo_opd.config import DistillationConfig, PolicyConfig
from nemo_opd.config.checks import template_fields
from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.chat import ChatFormatter, read_text_file
from nemo_opd.data.datasets import load_prompt_records
from nemo_opd.data.message_log import flatten_generation_logprobs, flatten_message_logs
from nemo_opd.data.prompt_loader import PromptLoader
from nemo_opd.distributed.cluster import (
    WorkerResources,
    build_placement_group,
    resolve_device_type,
)
from nemo_opd.distributed.nodes import choose_nodes, format_placement, placement_record
from nemo_opd.distributed.placement import (
    WorkerSplit,
    bundle_node_slots,
    generation_bundles,
    worker_split,
)
from nemo_opd.distributed.ray_runtime import init_ray
from nemo_opd.distributed.shared_paths import check_shared_paths, paths_workers_use
from nemo_opd.environments import MathEnvironment
from nemo_opd.errors import RunError, ServiceError, SetupError
from nemo_opd.generation import VllmGeneration, logprob_mismatch
from nemo_opd.losses import (
    DistillationLossFn,
    NLLLossFn,
    PolicyGradientLossFn,
    build_loss_mask,
)
from nemo_opd.policy.engines.base import metric_reduction
from nemo_opd.policy.policy import Policy
from nemo_opd.rollouts import RolloutResult, run_multi_turn_rollout
from nemo_opd.rollouts.off_policy import reference_rollout
from nemo_opd.teachers.privileged import PrivilegedContext
from nemo_opd.teachers.routed import RoutedTeachers, route_rows
from nemo_opd.teachers.served import ServedTeacher
from nemo_opd.teachers.served_checks import check_served_teacher
from nemo_opd.tiny.assets import recorded_heldout_accuracy, resolve_pretrained
from nemo_opd.utils.checkpoint_manager import CheckpointManager
from nemo_opd.utils.logger import Logger
from nemo_opd.utils.plot import ROLLOUTS_KEY, plot_metrics
from nemo_opd.utils.run_dirs import RunLock, check_writable, with_absolute_paths
from nemo_opd.utils.startup import StartupMarks, format_startup_report, startup_metrics
from nemo_opd.utils.stop_signal import StopSignal
from nemo_opd.utils.timers import Timers

FINAL_MODEL_DIR = "final_model"
ELAPSED_KEY = "progress/elapsed_s"
PLACEMENT_FILE = "placement.json"
"""Where Ray placed the run's workers (nodes.placement_record), in logger.log_dir."""
STOPPED_EXIT_STATUS = 128 + signal.SIGTERM
"""Exit status of a run that SIGTERM stopped at a clean point (the shell's convention)."""
SHARE = 1 / 3
"""Fraction of each training bundle (CPUs, GPU) taken by the student, the teacher and colocated
generation: they run one after another within a step, so they share the devices."""


@dataclass
class DistillationRun:
    """Everything setup() builds; distillation_train() drives it."""

    cfg: DistillationConfig
    formatter: ChatFormatter
    train_prompts: PromptSet
    val_prompts: PromptSet
    loader: PromptLoader
    environments: dict
    student: Policy
    teacher: Policy | RoutedTeachers | ServedTeacher | None
    generation: VllmGeneration
    loss_fn: DistillationLossFn | PolicyGradientLossFn | NLLLossFn
    val_loss_fn: DistillationLossFn | None
    logger: Logger
    checkpoints: CheckpointManager
    placement: PlacementGroup
    lock: RunLock
    privileged: PrivilegedContext | None = None
    """The teacher's own prompt (teacher.prompt_template), when it has one."""
    teacher_sampler: VllmGeneration | None = None
    """vLLM holding the teacher, sampling the off-policy steps' responses (seq_kd)."""
    step: int = 0
    generation_version: int = 0
    last_metrics: dict = field(default_factory=dict)
    startup: dict = field(default_factory=dict)
    """{process: {mark: time.time()}} of the driver and every worker (nemo_opd.utils.startup);
    logged as timing/startup/* with the first metrics, then cleared."""
    started_at: float = field(default_factory=time.time)
    """time.time() when the driver process started (progress/elapsed_s counts from it)."""

    def shutdown(self) -> None:
        """Stop every worker (generation first: it holds the most memory)."""
        teachers = _teacher_workers(self.teacher).values()
        for part in (self.generation, self.teacher_sampler, self.student, *teachers):
            if part is not None:
                part.shutdown()
        for env in self.environments.values():
            env.shutdown()
        ray.util.remove_placement_group(self.placement)
        if self.logger is not None:
            self.logger.close()
        self.lock.release()


def run(cfg: DistillationConfig) -> int:
    """Set up, train, export; returns the exit status: 0, or STOPPED_EXIT_STATUS when SIGTERM
    stopped the run early (with a checkpoint to resume from, and no final export). Bad input
    found at setup raises SetupError before any training."""
    state = setup(cfg)
    try:
        if not distillation_train(state):
            return STOPPED_EXIT_STATUS
        export_final_model(state)
    finally:
        state.shutdown()
    return 0


# ------------------------------------------------------------------------------------------ setup


def setup(cfg: DistillationConfig) -> DistillationRun:
    """Claim the output directories, then build everything (_build_run); the directories are
    released again if building fails."""
    marks = StartupMarks()
    cfg = with_absolute_paths(cfg)  # the workers' working directory is not the driver's
    lock = _claim_directories(cfg)
    try:
        return _build_run(cfg, lock, marks)
    except BaseException:
        lock.release()
        raise


def _claim_directories(cfg: DistillationConfig) -> RunLock:
    """This run alone uses checkpointing.checkpoint_dir (a lock held until shutdown), and it
    and logger.log_dir can be written: checked before anything starts."""
    lock = RunLock(cfg.checkpointing.checkpoint_dir)
    note = lock.acquire()
    if note:
        print(f"checkpoints: {note}")
    try:
        check_writable(cfg.checkpointing.checkpoint_dir, "checkpointing.checkpoint_dir")
        check_writable(cfg.logger.log_dir, "logger.log_dir")
    except SetupError:
        lock.release()
        raise
    return lock


def _build_run(cfg: DistillationConfig, lock: RunLock, marks: StartupMarks) -> DistillationRun:
    """Build tokenizer, data, environments, student, teacher, generation, loss and logging, and
    restore the newest checkpoint that verifies, if there is one. `marks` gets the driver's
    start-up times.

    Order (docs/benchmarks.md has the start-up profile): the tokenizers and model configs are
    checked; vLLM, whose start-up is the longest, is launched; the data are loaded while it
    loads; then student and teacher start, and the environments while they all load. When
    anything fails, the parts already started are shut down."""
    # Models: "tiny:*" names build (or reuse) the embedded assets here, once, on the driver.
    cfg = _resolve_model_paths(cfg)
    tokenizer = _check_models(cfg)
    served = _served_teacher(cfg, tokenizer) if _is_served(cfg) else None
    init_ray(cfg.cluster)  # the command line has started it already
    marks.note("ray")
    split = worker_split(cfg.cluster, cfg.policy.generation)
    device = resolve_device_type(cfg.cluster)
    check_megatron_training_precision(cfg.policy, device)
    placement = _reserve_workers(cfg, device)
    started = []
    try:
        generation = _build_generation(cfg, device, split, placement)
        started.append(generation)
        teacher_sampler = _build_teacher_sampler(cfg, device, split, placement)
        if teacher_sampler is not None:
            started.append(teacher_sampler)
        marks.note("vllm_launched")
        formatter, train, val = _load_prompts(cfg, tokenizer)
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
        )
        started.append(student)
        teacher = served
        if served is None and cfg.named_teachers:
            teacher = _start_teachers(cfg, split.training, placement)
            started.append(teacher)
        marks.note("workers_launched")
        environments = {"math": MathEnvironment(cfg.env.math)}
        _wait_for_workers(marks, student, _teacher_workers(teacher), generation, teacher_sampler)
    except BaseException:
        for part in started:
            part.shutdown()
        ray.util.remove_placement_group(placement)
        raise
    _print_temperatures(cfg)

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
        loss_fn=_build_loss(cfg),
        val_loss_fn=DistillationLossFn.from_config(cfg.loss_fn) if teacher else None,
        logger=None,
        checkpoints=CheckpointManager(cfg.checkpointing),
        placement=placement,
        lock=lock,
        privileged=_privileged_context(cfg, formatter),
        teacher_sampler=teacher_sampler,
    )
    _restore_latest(run_state)
    marks.note("setup_done")
    run_state.startup = _collect_startup(
        marks, student, _teacher_workers(teacher), generation, teacher_sampler
    )
    run_state.started_at = marks.as_dict()["process"]
    print(format_startup_report(marks.as_dict()["process"], run_state.startup))
    _report_placement(cfg, student, _teacher_workers(teacher), generation, teacher_sampler)
    run_state.logger = Logger(
        cfg.logger,
        run_config=cfg.model_dump(mode="json"),
        resume_step=run_state.step,
        total_steps=cfg.distillation.max_num_steps,
    )
    return run_state


def _check_models(cfg: DistillationConfig) -> PreTrainedTokenizerBase:
    """The student's tokenizer, after checking it against every teacher's, and the model configs
    against each other (vocabularies, tensor-parallel sizes, top-k); SetupError on a mismatch."""
    tokenizer = load_tokenizer(cfg.policy.tokenizer, "policy")
    local_teachers = {} if _is_served(cfg) else cfg.teacher_sections  # else: checked served
    for section, teacher in local_teachers.items():
        check_same_vocabulary(tokenizer, load_tokenizer(teacher.tokenizer, section))
    student_config = load_model_config(cfg.policy, "policy")
    check_tensor_parallel(cfg.policy, student_config, "policy")
    for section, teacher in local_teachers.items():
        teacher_config = load_model_config(teacher, section)
        check_vocab_sizes(student_config, teacher_config, len(tokenizer), section)
        check_tensor_parallel(teacher, teacher_config, section)
    if cfg.named_teachers and cfg.distillation.topk_logits_k > student_config.vocab_size:
        raise SetupError(
            f"distillation.topk_logits_k ({cfg.distillation.topk_logits_k}) exceeds the "
            f"vocabulary size ({student_config.vocab_size})"
        )
    return tokenizer


def _privileged_template(cfg: DistillationConfig) -> str | None:
    """teacher.prompt_template (the teacher's own prompt), if there is a teacher with one."""
    return cfg.teacher.prompt_template if cfg.teacher is not None else None


def _privileged_context(
    cfg: DistillationConfig, formatter: ChatFormatter
) -> PrivilegedContext | None:
    template = _privileged_template(cfg)
    return None if template is None else PrivilegedContext(formatter, template)


def _is_served(cfg: DistillationConfig) -> bool:
    return cfg.teacher is not None and cfg.teacher.server.enabled


def _start_teachers(
    cfg: DistillationConfig, workers: int, placement: PlacementGroup
) -> Policy | RoutedTeachers:
    """The in-process teacher's workers, or with several teachers one Policy each behind
    RoutedTeachers; the teachers split one teacher's share of every training bundle."""
    named = cfg.named_teachers
    policies = {
        name: Policy(
            teacher,
            cfg.cluster,
            optimizer=False,
            num_workers=workers,
            name="teacher" if cfg.teachers is None else f"teacher.{name}",
            placement=placement,
            share=SHARE / len(named),
            wait=False,
        )
        for name, teacher in named.items()
    }
    return policies["teacher"] if cfg.teachers is None else RoutedTeachers(policies)


def _served_teacher(cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase) -> ServedTeacher:
    """The teacher behind teacher.server, checked against the live server (SetupError)."""
    server = cfg.teacher.server
    teacher = ServedTeacher(
        server.base_url,
        server.model_name or cfg.teacher.model_name,
        timeout_s=server.timeout_s,
        max_concurrency=server.max_concurrency,
        max_retries=server.max_retries,
        backoff_s=server.retry_backoff_s,
        rows_per_request=server.rows_per_request,
    )
    check_served_teacher(
        teacher,
        topk=cfg.distillation.topk_logits_k,
        max_sequence_length=cfg.policy.max_total_sequence_length,
        tokenizer=tokenizer,
    )
    print(f"teacher: served by {server.base_url} (model {teacher.model!r})")
    return teacher


def _teacher_workers(
    teacher: Policy | RoutedTeachers | ServedTeacher | None,
) -> dict[str, Policy]:
    """{part name: Policy} of the teacher's Ray workers: {"teacher": ...}, one
    "teacher.<name>" per routed teacher, or {} (a served teacher has none to start or stop)."""
    if isinstance(teacher, RoutedTeachers):
        return {f"teacher.{name}": policy for name, policy in teacher.items()}
    return {"teacher": teacher} if isinstance(teacher, Policy) else {}


def _load_prompts(
    cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[ChatFormatter, PromptSet, PromptSet]:
    """The chat formatter and the train and validation prompts, rendered with the chat template
    and tokenized (too-long prompts skipped and counted); SetupError on bad data."""
    formatter = ChatFormatter(
        tokenizer,
        read_text_file(cfg.data.prompt_file, "data.prompt_file"),
        read_text_file(cfg.data.system_prompt_file, "data.system_prompt_file"),
    )
    max_prompt = cfg.data.max_input_seq_length or cfg.policy.max_total_sequence_length - 1
    template = _privileged_template(cfg)
    privileged = template is not None and "response" in template_fields(template)
    # The dataset's responses: the off-policy steps' data (unless the teacher samples it).
    off_policy = on_policy_share(cfg) < 1.0 and not cfg.distillation.seq_kd
    # Several teachers: each record's teacher, by data.teacher_key.
    teachers = list(cfg.teachers) if cfg.teachers is not None else None
    records = load_prompt_records(
        cfg.data, "train", responses=off_policy or privileged, teachers=teachers
    )
    train = encode_prompts(records, formatter, max_prompt, "train")
    val_records = load_prompt_records(
        cfg.data, "validation", responses=privileged, teachers=teachers
    )
    val = encode_prompts(val_records, formatter, max_prompt, "validation")
    if cfg.distillation.max_val_samples is not None:
        val.samples = val.samples[: cfg.distillation.max_val_samples]
    print(
        f"data: {len(train.samples)} train prompts ({train.skipped} skipped as longer than "
        f"{max_prompt} tokens), {len(val.samples)} validation prompts ({val.skipped} skipped)"
    )
    check_fills_one_batch(train, cfg.distillation.num_prompts_per_step, max_prompt)
    return formatter, train, val


def _named_parts(
    student: Policy,
    teachers: dict[str, Policy],
    generation: VllmGeneration | None,
    teacher_sampler: VllmGeneration | None,
) -> list[tuple[str, object]]:
    """(name, part) of what a run starts, in the order student, teachers (_teacher_workers'
    names), vLLM, the teacher's vLLM (seq_kd); the parts it did not start (None) left out."""
    parts = [("policy", student), *teachers.items()]
    parts += [("vllm", generation), ("teacher_vllm", teacher_sampler)]
    return [(name, part) for name, part in parts if part is not None]


def _wait_for_workers(marks: StartupMarks, *parts) -> None:
    """Block until every part (_named_parts' arguments) has started, marking each."""
    for name, part in _named_parts(*parts):
        part.wait_until_ready()
        marks.note(f"{name}_ready")


def _collect_startup(marks: StartupMarks, *parts) -> dict[str, dict[str, float]]:
    """{"driver": ..., "policy.<rank>": ..., "teacher.<rank>": ..., "vllm.<engine>": ...,
    "teacher_vllm.<engine>": ...} for _named_parts' arguments."""
    processes = {"driver": marks.as_dict()}
    for name, part in _named_parts(*parts):
        for index, worker in enumerate(part.startup_marks()):
            processes[f"{name}.{index}"] = worker
    return processes


def _build_teacher_sampler(
    cfg: DistillationConfig, device: str, split: WorkerSplit, placement: PlacementGroup
) -> VllmGeneration | None:
    """With distillation.seq_kd, vLLM holding the teacher (like the student's engines, with its
    generation settings); SetupError for colocated generation on CUDA (no room for it yet)."""
    if not cfg.distillation.seq_kd:
        return None
    if device == "cuda" and cfg.policy.generation.colocated.enabled:
        raise SetupError(
            "distillation.seq_kd needs a second vLLM engine (the teacher's), which colocated "
            "generation on GPUs has no room for yet; set "
            "policy.generation.colocated.enabled=false"
        )
    return _build_generation(cfg, device, split, placement, cfg.teacher)


def _resolve_model_paths(cfg: DistillationConfig) -> DistillationConfig:
    """The config with "tiny:*" model and tokenizer names replaced by local directories (not a
    served teacher's: its name is the one the server knows, and nothing of it is loaded here)."""
    update = {"policy": cfg.policy.with_names(resolve_pretrained)}
    if cfg.teacher is not None and not _is_served(cfg):
        update["teacher"] = cfg.teacher.with_names(resolve_pretrained)
    if cfg.teachers is not None:
        update["teachers"] = {
            name: teacher.with_names(resolve_pretrained) for name, teacher in cfg.teachers.items()
        }
    return cfg.model_copy(update=update)


def _rollouts_per_step(cfg: DistillationConfig) -> int:
    return cfg.distillation.num_prompts_per_step * cfg.distillation.num_generations_per_prompt


def _optimizer_steps_per_step(cfg: DistillationConfig) -> int:
    return _rollouts_per_step(cfg) // cfg.policy.train_global_batch_size


def _build_generation(
    cfg: DistillationConfig,
    device: str,
    split: WorkerSplit,
    placement: PlacementGroup,
    model: PolicyConfig | None = None,
) -> VllmGeneration:
    """vLLM engines holding the student's initial weights (or `model`'s: the teacher's, for
    distillation.seq_kd; never refit), in the placement's generation bundles
    (placement.generation_bundles). On CUDA: one per generation worker, a third of a training
    bundle when colocated (next to student and teacher), a whole bundle of its own otherwise.
    On CPU: one per node that generates, with no reservation, on as many threads as the
    training workers of a node hold CPUs (it time-shares the cores with training, which waits
    while it generates)."""
    gen_cfg = cfg.policy.generation
    colocated = device == "cuda" and gen_cfg.colocated.enabled
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
        cpu_threads=cfg.cluster.cpus_per_worker * cfg.cluster.gpus_per_node,
        gpus_per_engine=SHARE if colocated else None,
        placement=placement,
        bundles=bundles,
        wait=False,
    )


def _reserve_workers(cfg: DistillationConfig, device: str) -> PlacementGroup:
    """The placement group of the run: cluster.num_nodes nodes chosen (SetupError when the
    cluster lacks them), checked to see the paths the workers use, and one bundle per worker
    pinned to its node (placement.bundle_node_slots)."""
    resources = WorkerResources(device, cfg.cluster.cpus_per_worker)
    nodes = choose_nodes(cfg.cluster, resources)
    check_shared_paths(paths_workers_use(cfg), nodes)
    slots = bundle_node_slots(cfg.cluster)
    return build_placement_group(len(slots), resources, nodes=[nodes[s].node_id for s in slots])


def _report_placement(cfg: DistillationConfig, *parts: Policy | VllmGeneration | None) -> None:
    """Print where Ray placed every worker (_named_parts' order) and write it to
    logger.log_dir/placement.json."""
    record = placement_record({name: part.nodes() for name, part in _named_parts(*parts)})
    print(format_placement(record))
    log_dir = Path(cfg.logger.log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / PLACEMENT_FILE).write_text(json.dumps(record, indent=2) + "\n")


def _build_loss(cfg: DistillationConfig) -> DistillationLossFn | PolicyGradientLossFn | NLLLossFn:
    """The objective's training loss: the top-k divergence, the supervised NLL, or the
    policy-gradient loss at the sampling temperature (its ratios compare with vLLM's sampling
    log-probs)."""
    if cfg.objective.loss == "topk_kl":
        return DistillationLossFn.from_config(cfg.loss_fn)
    if cfg.objective.loss == "sft":
        return NLLLossFn()
    return PolicyGradientLossFn.from_config(
        cfg.objective, cfg.loss_fn, temperature=_sampling_temperature(cfg)
    )


def _sampling_temperature(cfg: DistillationConfig) -> float:
    return cfg.policy.generation.temperature or 1.0


def _teacher_temperature(cfg: DistillationConfig) -> float:
    return cfg.distillation.teacher_temperature or cfg.loss_fn.temperature


def _print_temperatures(cfg: DistillationConfig) -> None:
    objective = cfg.objective
    student = cfg.loss_fn.temperature
    if objective.loss == "policy_gradient":
        student = _sampling_temperature(cfg)
    teacher = f", teacher {_teacher_temperature(cfg)}" if objective.uses_teacher else ""
    print(
        f"objective: {_describe_objective(cfg)}\n"
        f"temperatures: sampling {cfg.policy.generation.temperature}, student in the loss "
        f"{student}{teacher}"
    )


def _describe_objective(cfg: DistillationConfig) -> str:
    """One line naming the loss, its enabled terms and the share of on-policy steps."""
    objective = cfg.objective
    if objective.loss == "sft":
        return "supervised NLL of the dataset's responses (no teacher)"
    if objective.loss == "topk_kl":
        topk = f"top-k {cfg.loss_fn.kl_type} divergence (k={cfg.distillation.topk_logits_k})"
        share = on_policy_share(cfg)
        if share < 1.0:
            topk += f", on-policy share {share:g} (lmbda; the rest the dataset's responses)"
        return topk
    terms = []
    if objective.opd_coef > 0:
        terms.append(
            f"{objective.opd_coef} x sampled reverse KL (discount {objective.opd_discount})"
        )
    if objective.uses_reward:
        terms.append(f"{objective.reward_coef} x reward ({objective.reward_estimator})")
    loss = f"policy gradient over advantages {' + '.join(terms)}"
    if objective.topk_kl_coef > 0:
        loss += f", plus {objective.topk_kl_coef} x top-k {cfg.loss_fn.kl_type} divergence"
    return loss


def _restore_latest(state: DistillationRun) -> None:
    """Load the newest checkpoint of checkpointing.checkpoint_dir that verifies, if any; newer
    ones that do not are set aside under unreadable/ and reported."""
    if not state.cfg.checkpointing.enabled:
        return
    point = state.checkpoints.resume_point()
    for moved, reason in point.set_aside:
        print(f"checkpoint not resumable, set aside as {moved}: {reason}")
    if point.path is None:
        return
    path = point.path
    saved = state.checkpoints.load_state(path)
    state.student.load(str(path / "policy"))
    state.loader.load_state_dict(saved["state"]["loader"])
    state.step = int(saved["step"])
    state.generation_version = -1  # vLLM holds the initial weights: refit before sampling
    state.last_metrics = dict(saved.get("metrics", {}))
    print(f"resumed from {path} (step {state.step})")


# --------------------------------------------------------------------------------------- training


def distillation_train(state: DistillationRun) -> bool:
    """Run steps until max_num_steps or max_num_epochs (see the module docstring). Returns
    False when SIGTERM stopped it early: after the step in progress, with a checkpoint."""
    loop = state.cfg.distillation
    timers = Timers()
    if loop.val_at_start and state.step == 0:
        metrics = {**validate(state, timers), **timers.summary(), ROLLOUTS_KEY: 0}
        state.logger.log({**metrics, **_progress_metrics(state)}, step=0)
    batches = iter(state.loader)
    with StopSignal() as stop:
        while state.step < loop.max_num_steps and state.loader.epoch < loop.max_num_epochs:
            step = state.step + 1
            position = state.loader.state_dict()  # where this step's prompts start
            try:
                metrics = _step_and_validate(state, next(batches), step, timers)
            except ServiceError as error:
                raise _end_on_service_error(state, error, step, position) from error
            last = step == loop.max_num_steps
            metrics.update(_timing_metrics(timers, metrics["train/num_tokens"]))
            metrics.update(_progress_metrics(state))
            state.logger.log(metrics, step=step)
            state.last_metrics.update(metrics)
            stopping = stop.requested and not last
            if state.checkpoints.should_save(step, is_last=last or stopping):
                _save_checkpoint(state)
            if stopping:
                print(f"stopped after step {step} on SIGTERM; run the same command to resume")
                return False
    return True


def _step_and_validate(state: DistillationRun, samples: list, step: int, timers: Timers) -> dict:
    """One training step (state.step becomes `step`), then validation when it is due."""
    loop = state.cfg.distillation
    with timers.time("train"):
        metrics = _train_step(state, samples, step, timers)
    state.step = step
    metrics[ROLLOUTS_KEY] = step * _rollouts_per_step(state.cfg)
    last = step == loop.max_num_steps
    if (loop.val_period and step % loop.val_period == 0) or (last and loop.val_at_end):
        metrics.update(validate(state, timers))
    return metrics


def _end_on_service_error(
    state: DistillationRun, error: ServiceError, step: int, position: dict
) -> RunError:
    """The error that ends a run whose outside service (a teacher server) failed in `step`.
    The run's own workers are intact, so the last completed step is checkpointed first (unless
    it is already): a failure in training leaves the student at step - 1 with its prompts at
    `position`; one in validation leaves it at `step`. The same command resumes from there."""
    if state.step < step:
        state.loader.load_state_dict(position)
    if not state.cfg.checkpointing.enabled:
        return RunError(f"{error} (checkpointing is disabled: the run will start afresh)")
    if state.step == 0:
        return RunError(f"{error} (no step was completed: the run will start afresh)")
    if state.step not in state.checkpoints.checkpoints():
        _save_checkpoint(state)
    directory = state.cfg.checkpointing.checkpoint_dir
    return RunError(f"{error} (step {state.step}, the last completed, is saved in {directory})")


def _progress_metrics(state: DistillationRun) -> dict:
    """progress/elapsed_s (seconds since the driver process started) and, the first time in a
    process, timing/startup/*."""
    metrics = {ELAPSED_KEY: time.time() - state.started_at}
    if state.startup:
        metrics.update(startup_metrics(state.started_at, state.startup))
        state.startup = {}
    return metrics


def _train_step(state: DistillationRun, samples: list, step: int, timers: Timers) -> dict:
    """Steps 1-6 of the loop for one batch of prompts; returns its metrics."""
    cfg = state.cfg
    on_policy = is_on_policy_step(cfg, step)
    # 1. refit (only when the student samples)
    if on_policy:
        with timers.time("refit"):
            _refit_if_stale(state)
    # 2. rollout: the student's own samples, or off-policy responses
    with timers.time("generation"):
        rollout = _step_rollout(state, samples, step, on_policy)
    # 3. flatten and 4. teacher
    objective = cfg.objective
    batch = _scored_batch(
        state, rollout, timers, topk=objective.uses_topk, sampled=objective.uses_sampled_teacher
    )
    metrics = {}
    # 5. advantages
    if objective.loss == "policy_gradient":
        metrics.update(_policy_gradient_inputs(state, batch, rollout, len(samples), timers))
    if cfg.policy.generation.logprob_check and on_policy:
        with timers.time("logprob_check"):
            metrics["generation/logprob_mismatch"] = _logprob_mismatch(state, batch, rollout)
    # 6. train
    with timers.time("policy_training"):
        history = state.student.train(batch, state.loss_fn)
    metrics.update(_train_metrics(history, batch, rollout))
    metrics.update(_route_metrics(_routes(state, rollout), rollout.rewards))
    if isinstance(state.teacher, ServedTeacher):
        metrics["teacher/server_retries"] = state.teacher.retries
    state.logger.log_rollouts(_rollout_records(rollout), step=step)
    return metrics


def _step_rollout(
    state: DistillationRun, samples: list, step: int, on_policy: bool
) -> RolloutResult:
    """Step 2: num_generations_per_prompt conversations of each prompt, sampled by the student
    (on-policy), or off-policy: sampled by the teacher (seq_kd) or the dataset's responses.
    rollout/on_policy and rollout/teacher_sampled say which."""
    cfg = state.cfg
    logs, metadata = repeat_samples(samples, cfg.distillation.num_generations_per_prompt)
    seed = _step_seed(cfg, step)
    sampler = state.teacher_sampler
    if on_policy:
        rollout = _rollout(state, logs, metadata, greedy=False, seed=seed)
    elif sampler is not None:
        temperature = _teacher_temperature(cfg)
        rollout = _rollout(
            state, logs, metadata, greedy=False, seed=seed, temperature=temperature, engine=sampler
        )
    else:
        max_len = cfg.policy.max_total_sequence_length
        rollout = reference_rollout(logs, metadata, state.formatter, state.environments, max_len)
    rollout.metrics["on_policy"] = float(on_policy)
    rollout.metrics["teacher_sampled"] = float(not on_policy and sampler is not None)
    return rollout


def _scored_batch(
    state: DistillationRun, rollout: RolloutResult, timers: Timers, *, topk: bool, sampled: bool
) -> TensorBatch:
    """Steps 3-4: the rollouts flattened into a batch (input_ids, input_lengths, token_mask,
    sample_mask) with, as asked, the teacher's top-k log-probs and ids of every position
    (teacher_topk_logprobs, teacher_topk_indices [B, S, k]) and its log-prob of every sampled
    token (teacher_logprobs [B, S], position t scoring token t + 1)."""
    cfg = state.cfg
    pad = state.formatter.tokenizer.pad_token_id
    batch = flatten_message_logs(rollout.message_logs, pad)
    temperature = _teacher_temperature(cfg)
    # A privileged teacher scores its own rows (its prompt, the same conversation after it);
    # its outputs come back in the student's positions.
    rows = None
    if state.privileged is not None and (topk or sampled):
        rows = state.privileged.teacher_rows(rollout.message_logs, rollout.metadata, pad)
    scored = batch if rows is None else rows.batch
    width = batch["input_ids"].shape[1]

    def as_student(values: torch.Tensor) -> torch.Tensor:
        return values if rows is None else rows.to_student(values, width)

    # Several teachers: each row is scored by the teacher its prompt's record names.
    routes = _routes(state, rollout)
    routing = {} if routes is None else {"routes": routes}
    if topk:
        with timers.time("teacher_topk"):
            values, indices = state.teacher.get_topk_logits(
                scored, cfg.distillation.topk_logits_k, temperature=temperature, **routing
            )
        batch["teacher_topk_logprobs"] = as_student(values)
        batch["teacher_topk_indices"] = as_student(indices)
    if sampled:
        with timers.time("teacher_logprobs"):
            logprobs = state.teacher.get_logprobs(scored, temperature=temperature, **routing)
        batch["teacher_logprobs"] = as_student(logprobs)
    return batch


def _routes(state: DistillationRun, rollout: RolloutResult) -> list[str] | None:
    """The teacher of every row of a rollout (its prompt record's), with several teachers."""
    if not isinstance(state.teacher, RoutedTeachers):
        return None
    return [meta["teacher"] for meta in rollout.metadata]


def _route_metrics(routes: list[str] | None, rewards: torch.Tensor) -> dict:
    """teacher/<name>/samples (rows routed to it) and teacher/<name>/reward (their mean reward),
    with several teachers."""
    metrics = {}
    for name, rows in route_rows(routes or []).items():
        metrics[f"teacher/{name}/samples"] = float(len(rows))
        metrics[f"teacher/{name}/reward"] = float(rewards[rows].mean())
    return metrics


def _policy_gradient_inputs(
    state: DistillationRun,
    batch: TensorBatch,
    rollout: RolloutResult,
    num_prompts: int,
    timers: Timers,
) -> dict:
    """Step 5: add old_logprobs (the student's, before this step's updates, at the sampling
    temperature), sampler_logprobs (vLLM's) and advantages ([B, S], position t scoring token
    t + 1) to the batch; returns the advantages' metrics as train/*."""
    cfg, objective = state.cfg, state.cfg.objective
    with timers.time("old_logprobs"):
        old = state.student.get_logprobs(batch, temperature=_sampling_temperature(cfg))
    batch["old_logprobs"] = old
    batch["sampler_logprobs"] = _sampler_logprobs(rollout, old)
    with timers.time("advantages"):
        mask = build_loss_mask(batch["token_mask"], batch["sample_mask"])
        advantages, stats = compute_advantages(
            mask,
            rewards=rollout.rewards,
            group_ids=group_ids_for(num_prompts, cfg.distillation.num_generations_per_prompt),
            student_logprobs=old,
            teacher_logprobs=batch.get("teacher_logprobs"),
            opd_coef=objective.opd_coef,
            opd_discount=objective.opd_discount,
            reward_estimator=objective.reward_estimator if objective.uses_reward else "none",
            reward_coef=objective.reward_coef,
            normalize_std=objective.grpo_normalize_std,
        )
    batch["advantages"] = advantages
    return {f"train/{name}": value for name, value in stats.items()}


def _sampler_logprobs(rollout: RolloutResult, old: torch.Tensor) -> torch.Tensor:
    """vLLM's log-prob of every sampled token at the position that predicts it, [B, S]; where
    vLLM reported none (tokens it did not sample), the student's own (a correction weight
    of 1)."""
    generated, known = flatten_generation_logprobs(rollout.message_logs, old.shape[1])
    shifted = torch.roll(generated, -1, dims=1)
    known = torch.roll(known, -1, dims=1)
    known[:, -1] = 0
    return torch.where(known > 0, shifted, old)


def _timing_metrics(timers: Timers, num_tokens: float) -> dict:
    """Seconds per phase ("timing/train/<phase>", the whole step as
    "timing/train/total_step_time") and trained tokens per second."""
    timings = timers.summary()
    total = timings.pop("timing/train")
    timings["timing/train/total_step_time"] = total
    timings["train/tokens_per_sec"] = num_tokens / total
    return timings


def _refit_if_stale(state: DistillationRun) -> None:
    """Push the student's weights into vLLM when they changed since the last push."""
    version = state.step
    if version != state.generation_version:
        state.generation.refit(state.student.full_weights_ref(), version)
        state.generation_version = version


def _rollout(
    state: DistillationRun,
    logs: list,
    metadata: list,
    *,
    greedy: bool,
    seed: int | None,
    temperature: float | None = None,
    engine: VllmGeneration | None = None,
) -> RolloutResult:
    """Rollouts with the generation engine (the student's, or `engine`) awake (and asleep again
    afterwards)."""
    cfg = state.cfg
    engine = engine or state.generation
    engine.prepare_for_generation()
    try:
        return run_multi_turn_rollout(
            engine,
            logs,
            metadata,
            state.formatter,
            state.environments,
            max_seq_len=cfg.policy.max_total_sequence_length,
            max_rollout_turns=cfg.distillation.max_rollout_turns,
            max_new_tokens=cfg.policy.generation.max_new_tokens,
            greedy=greedy,
            seed=seed,
            temperature=temperature,
        )
    finally:
        engine.finish_generation()


def _step_seed(cfg: DistillationConfig, step: int) -> int:
    """Sampling seed of a step: a function of (seed, step) only, so resumed runs sample the
    same rollouts as uninterrupted ones. Turns add their index to it."""
    return cfg.distillation.seed * 1_000_003 + step * 1_000


def _logprob_mismatch(state: DistillationRun, batch: TensorBatch, rollout: RolloutResult) -> float:
    """Mean |vLLM log-prob - student log-prob| over the generated tokens of this step's first
    generation.logprob_check_samples rollouts (all of them when null); a policy-gradient step
    reuses the old log-probs it already computed."""
    gen_cfg = state.cfg.policy.generation
    rows = min(batch.size, gen_cfg.logprob_check_samples or batch.size)
    checked = batch.slice(0, rows)
    if "old_logprobs" in checked:
        student = checked["old_logprobs"]
    else:
        student = state.student.get_logprobs(checked, temperature=_sampling_temperature(state.cfg))
    generated, mask = flatten_generation_logprobs(
        rollout.message_logs[:rows], checked["input_ids"].shape[1]
    )
    # Position t of get_logprobs scores token t + 1.
    return logprob_mismatch(generated[:, 1:], student[:, :-1], mask[:, 1:])


def _train_metrics(history: dict, batch: TensorBatch, rollout: RolloutResult) -> dict:
    """train/* (loss-function metrics averaged over the step's optimizer steps; *_min / *_max:
    their min / max), rollout/*."""
    combine = {"min": min, "max": max, "sum": lambda values: sum(values) / len(values)}
    metrics = {
        f"train/{name}": combine[metric_reduction(name)](values) for name, values in history.items()
    }
    metrics["train/reward"] = float(rollout.rewards.mean())
    metrics["train/num_tokens"] = float(batch["input_lengths"].sum())
    metrics.update({f"rollout/{name}": value for name, value in rollout.metrics.items()})
    metrics.update(rollout.env_metrics)
    return metrics


def _rollout_records(rollout: RolloutResult) -> list[dict]:
    """JSON-friendly rollouts: the first prompt, the assistant turns (joined by " || "), the
    whole conversation, the reference answer and the reward."""
    records = []
    for log, meta, reward, truncated in zip(
        rollout.message_logs, rollout.metadata, rollout.rewards, rollout.truncated, strict=True
    ):
        replies = [m["content"] for m in log if m["role"] == "assistant"]
        records.append(
            {
                "prompt": meta.get("prompt", ""),
                "response": " || ".join(replies),
                "answer": meta.get("answer"),
                "reward": float(reward),
                "truncated": bool(truncated),
                "messages": [{"role": m["role"], "content": m["content"]} for m in log],
            }
        )
    return records


# ------------------------------------------------------------------------------------- validation


def validate(state: DistillationRun, timers: Timers) -> dict:
    """Greedy rollouts of the validation prompts: accuracy (mean env reward), average generated
    length and, with a teacher, the top-k divergence between student and teacher on those
    rollouts; with distillation.val_samples_per_prompt = k, also avg@k and pass@k of k sampled
    rollouts per prompt."""
    loop = state.cfg.distillation
    with timers.time("validation"):
        with timers.time("refit"):
            _refit_if_stale(state)
        metrics = _validate_greedy(state, timers)
        if loop.val_samples_per_prompt:
            metrics.update(_validate_sampled(state, timers, loop.val_samples_per_prompt))
    return metrics


def _validate_greedy(state: DistillationRun, timers: Timers) -> dict:
    """validation/accuracy, avg_length and, with a teacher, the divergence metrics; with several
    teachers, each teacher's own as validation/teacher/<name>/* (its prompts' rollouts)."""
    loop = state.cfg.distillation
    samples = state.val_prompts.samples
    rewards, routes, lengths, divergence = [], [], [], DivergenceSums()
    env_metrics: dict[str, float] = defaultdict(float)
    for start in range(0, len(samples), loop.val_batch_size):
        chunk = samples[start : start + loop.val_batch_size]
        logs, metadata = repeat_samples(chunk, 1)
        with timers.time("generation"):
            rollout = _rollout(state, logs, metadata, greedy=True, seed=None)
        rewards.append(rollout.rewards)
        for name, value in rollout.env_metrics.items():
            env_metrics[f"validation/{name}"] += value
        lengths.append(rollout.metrics["mean_generated_tokens"] * len(chunk))
        chunk_routes = _routes(state, rollout)
        routes += chunk_routes or []
        if state.val_loss_fn is None:
            continue
        batch = _scored_batch(state, rollout, timers, topk=True, sampled=False)
        with timers.time("student_eval"):
            # With several teachers, each teacher's rows apart: the overall values are the
            # token-weighted means of theirs.
            groups = route_rows(chunk_routes) if chunk_routes else {"": None}
            for name, rows in groups.items():
                part = batch if rows is None else TensorBatch(batch).select(rows)
                divergence.add(state.student.evaluate(part, state.val_loss_fn), name)
    rewards = torch.cat(rewards)
    metrics = {
        "validation/accuracy": float(rewards.mean()),
        "validation/avg_length": sum(lengths) / len(samples),
        **divergence.means("validation/"),
        **env_metrics,
    }
    for name, rows in route_rows(routes).items():
        metrics[f"validation/teacher/{name}/accuracy"] = float(rewards[rows].mean())
    return metrics


class DivergenceSums:
    """Token-weighted sums of the validation loss's metrics, overall and per teacher."""

    NAMES = ("loss", "forward_kl", "reverse_kl", "top1_agreement")

    def __init__(self) -> None:
        self.sums: dict[str, dict[str, float]] = {}

    def add(self, evaluated: dict, teacher: str) -> None:
        """Add one evaluate() result; teacher "" for a run with one teacher."""
        tokens = evaluated["global_valid_toks"]
        for group in {"", teacher}:
            sums = self.sums.setdefault(group, {"tokens": 0.0})
            sums["tokens"] += tokens
            for name in self.NAMES:
                sums[name] = sums.get(name, 0.0) + evaluated[name] * tokens

    def means(self, prefix: str) -> dict:
        """{prefix + name: mean} overall, {prefix + "teacher/<t>/" + name: mean} per teacher."""
        metrics = {}
        for group, sums in self.sums.items():
            where = prefix if group == "" else f"{prefix}teacher/{group}/"
            for name in self.NAMES:
                metrics[where + name] = sums[name] / max(sums["tokens"], 1.0)
        return metrics


def _validate_sampled(state: DistillationRun, timers: Timers, k: int) -> dict:
    """validation/accuracy_avg@k (mean reward over k samples of every prompt at
    distillation.val_temperature) and validation/pass@k (the fraction of prompts with a
    reward-1 sample). Seeds depend only on (seed, prompt index), so every validation samples
    alike and a resumed run reproduces them."""
    loop = state.cfg.distillation
    samples = state.val_prompts.samples
    chunk_prompts = max(1, loop.val_batch_size // k)
    rewards = []
    for start in range(0, len(samples), chunk_prompts):
        logs, metadata = repeat_samples(samples[start : start + chunk_prompts], k)
        seed = loop.seed * 1_000_003 + 7 + start * k * 1_000
        with timers.time("generation"):
            rollout = _rollout(
                state, logs, metadata, greedy=False, seed=seed, temperature=loop.val_temperature
            )
        rewards.append(rollout.rewards)
    per_prompt = torch.cat(rewards).reshape(len(samples), k)
    return {
        f"validation/accuracy_avg@{k}": float(per_prompt.mean()),
        f"validation/pass@{k}": float((per_prompt >= 1).any(dim=1).float().mean()),
    }


# ------------------------------------------------------------------------------- save and export


def _save_checkpoint(state: DistillationRun) -> None:
    """An atomic checkpoint of the student and the loop position (ranked by the metric). A
    save that fails (a full disk, a file-size limit, a worker that died) ends the run with a
    RunError saying that the earlier checkpoints are intact."""
    saved = {"loader": state.loader.state_dict()}
    metrics = {k: v for k, v in state.last_metrics.items() if isinstance(v, int | float)}
    try:
        state.checkpoints.save(
            state.step,
            lambda directory: state.student.save(str(Path(directory) / "policy")),
            state=saved,
            metrics=metrics,
        )
    except (OSError, RunError) as error:
        earlier = [step for step in state.checkpoints.checkpoints() if step < state.step]
        kept = f"step {max(earlier)}" if earlier else "none: the run will start afresh"
        raise RunError(
            f"saving the checkpoint of step {state.step} failed, and nothing of it was kept: "
            f"{error}. The earlier checkpoints are intact (newest: {kept}); free space or fix "
            "the cause, then run the same command again to resume"
        ) from error


def export_final_model(state: DistillationRun) -> Path:
    """The trained student in Hugging Face format (weights, config, tokenizer; a LoRA student
    merged, with its peft adapter in final_model/adapter) under
    checkpointing.checkpoint_dir/final_model, and the PNG of the training curves."""
    target = Path(state.cfg.checkpointing.checkpoint_dir) / FINAL_MODEL_DIR
    state.student.export(str(target))
    state.formatter.tokenizer.save_pretrained(str(target))
    metrics_file = Path(state.cfg.logger.log_dir) / "metrics.jsonl"
    if metrics_file.exists():
        references = {}
        teacher = state.cfg.teacher
        accuracy = recorded_heldout_accuracy(teacher.model_name) if teacher else None
        if accuracy is not None:
            references["validation/accuracy"] = ("teacher, at its build", accuracy)
        plot_metrics(
            metrics_file, Path(state.cfg.logger.log_dir) / "curves.png", references=references
        )
    print(f"final student: {target}")
    return target
