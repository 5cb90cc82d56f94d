"""Building a distillation run: everything the loop (algorithms/distillation.py) drives.

    setup(cfg) -> DistillationRun

In order (docs/benchmarks.md has the start-up profile): claim the checkpoint and log
directories (one run per checkpoint directory); resolve the tiny assets and check tokenizers
and model configs against each other; reach a served teacher and check it; start Ray and
reserve one placement bundle per worker on the chosen nodes (checked to see the run's paths);
launch vLLM, whose start-up is the longest; load and tokenize the data while it loads; launch
the student's and the teachers' workers and the environments; wait for them all (each wait with
a time-out); restore the newest checkpoint that verifies; report start-up times and placement.
When anything fails, what was already started is shut down and the directories released.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
import torch
from ray.util.placement_group import PlacementGroup
from transformers import PreTrainedTokenizerBase

from nemo_opd.algorithms.data_mix import on_policy_share
from nemo_opd.algorithms.model_checks import (
    check_megatron_training_precision,
    check_tensor_parallel,
    check_vocab_sizes,
    check_weights,
    load_model_config,
)
from nemo_opd.algorithms.prompts import PromptSet, check_fills_one_batch, encode_prompts
from nemo_opd.algorithms.tokenizers import load_tokenizer, tokenizer_difference
from nemo_opd.config import DistillationConfig, PolicyConfig
from nemo_opd.config.checks import overlap_problem, template_fields
from nemo_opd.config.worker_split import WorkerSplit, worker_split
from nemo_opd.data.chat import ChatFormatter, read_text_file
from nemo_opd.data.datasets import load_prompt_records
from nemo_opd.data.prompt_loader import PromptLoader
from nemo_opd.distributed.cluster import (
    WorkerResources,
    build_placement_group,
    describe_device,
    resolve_device_type,
)
from nemo_opd.distributed.nodes import choose_nodes, format_placement, placement_record
from nemo_opd.distributed.placement import bundle_node_slots, generation_bundles
from nemo_opd.distributed.ray_runtime import init_ray
from nemo_opd.distributed.shared_paths import check_shared_paths, paths_workers_use
from nemo_opd.environments.build import build_environments
from nemo_opd.errors import SetupError
from nemo_opd.generation import VllmGeneration
from nemo_opd.losses import DistillationLossFn, NLLLossFn, PolicyGradientLossFn
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.policy.policy import Policy
from nemo_opd.rollouts import RolloutResult, rollout_from_state
from nemo_opd.teachers.base import Teacher
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher, TeacherRendering
from nemo_opd.teachers.in_process import InProcessTeacher
from nemo_opd.teachers.privileged import PrivilegedContext, PrivilegedTeacher
from nemo_opd.teachers.routed import RoutedTeachers
from nemo_opd.teachers.self_teacher import SelfTeacher
from nemo_opd.teachers.served import ServedTeacher
from nemo_opd.teachers.served_checks import check_served_teacher, server_api_key
from nemo_opd.tiny.assets import resolve_pretrained
from nemo_opd.tools.base import tool_schemas
from nemo_opd.utils.checkpoint_manager import CheckpointManager
from nemo_opd.utils.logger import Logger
from nemo_opd.utils.run_dirs import RunLock, check_writable, with_absolute_paths
from nemo_opd.utils.startup import StartupMarks, format_startup_report

PLACEMENT_FILE = "placement.json"
ROLLOUTS_AHEAD_FILE = "rollouts_ahead.pt"
"""In a checkpoint of step k with max_staleness s > 0: the rollouts of steps k+1..k+s."""
ROLLOUTS_AHEAD_KEY = "rollouts_ahead"
"""The checkpoint state's list of the steps whose rollouts ROLLOUTS_AHEAD_FILE holds."""
"""Where Ray placed the run's workers (nodes.placement_record), in logger.log_dir."""
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
    teacher: Teacher | None
    generation: VllmGeneration
    loss_fn: DistillationLossFn | PolicyGradientLossFn | NLLLossFn
    val_loss_fn: DistillationLossFn | FullVocabDistillationLossFn | None
    logger: Logger
    checkpoints: CheckpointManager
    placement: PlacementGroup
    lock: RunLock
    teacher_sampler: VllmGeneration | None = None
    """vLLM holding the teacher, sampling the off-policy steps' responses (seq_kd)."""
    step: int = 0
    generation_version: int = 0
    """The weights version the generation engine holds (the steps trained into them)."""
    resumed_step: int = 0
    """The step the run resumed from (0: a fresh run)."""
    loader_position: dict | None = None
    """The loader's state after the last trained step's prompts (what a checkpoint records;
    the loader itself runs ahead with the rollout producer)."""
    saved_rollouts: dict[int, RolloutResult] = field(default_factory=dict)
    """The resumed checkpoint's rollouts of the steps after it (max_staleness > 0), by step."""
    last_metrics: dict = field(default_factory=dict)
    startup: dict = field(default_factory=dict)
    """{process: {mark: time.time()}} of the driver and every worker (nemo_opd.utils.startup);
    logged as timing/startup/* with the first metrics, then cleared."""
    started_at: float = field(default_factory=time.time)
    """time.time() when the driver process started (progress/elapsed_s counts from it)."""

    def shutdown(self) -> None:
        """Stop every worker (generation first: it holds the most memory)."""
        for part in (self.generation, self.teacher_sampler, self.student, self.teacher):
            if part is not None:
                part.shutdown()
        for env in self.environments.values():
            env.shutdown()
        ray.util.remove_placement_group(self.placement)
        if self.logger is not None:
            self.logger.close()
        self.lock.release()


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
    tokenizer, renderings = _check_models(cfg)
    served = _served_teacher(cfg, tokenizer) if _is_served(cfg) else None
    init_ray(cfg.cluster)  # the command line has started it already
    marks.note("ray")
    split = worker_split(cfg.cluster, cfg.policy.generation)
    device = resolve_device_type(cfg.cluster)
    print(describe_device(cfg.cluster, device, ray.cluster_resources().get("GPU", 0)))
    print(_describe_workers(cfg, device, split))
    check_megatron_training_precision(cfg.policy, device)
    cannot_overlap = overlap_problem(cfg, device)
    if cannot_overlap:
        raise SetupError(cannot_overlap)
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
        context = _privileged_context(cfg, formatter, [train, val])
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
        )
        started.append(student)
        teacher = served
        if served is None and cfg.named_teachers:
            threads = overlap_threads(cfg, device)
            teacher = _start_teachers(cfg, renderings, split.training, placement, threads)
            started.append(teacher)
        self_teacher = SelfTeacher(student) if cfg.self_teacher is not None else None
        teacher = _with_privileged_context(self_teacher or teacher, context, formatter)
        marks.note("workers_launched")
        environments = build_environments(cfg.env)
        started.extend(environments.values())
        _wait_for_workers(marks, student, teacher, generation, teacher_sampler)
        if self_teacher is not None:  # the student's workers hold the teacher's weights
            self_teacher.start(cfg.self_teacher)
        elif cfg.loss_fn.support != "teacher_topk":  # the student applies the teacher's head
            student.load_teacher_head(cfg.teacher.model_name, cfg.teacher.precision)
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
        val_loss_fn=distillation_loss(cfg) if teacher else None,
        logger=None,
        checkpoints=CheckpointManager(cfg.checkpointing),
        placement=placement,
        lock=lock,
        teacher_sampler=teacher_sampler,
    )
    _restore_latest(run_state)
    marks.note("setup_done")
    run_state.startup = _collect_startup(marks, student, teacher, generation, teacher_sampler)
    run_state.started_at = marks.as_dict()["process"]
    print(format_startup_report(marks.as_dict()["process"], run_state.startup))
    _report_placement(cfg, student, teacher, generation, teacher_sampler)
    run_state.logger = Logger(
        cfg.logger,
        run_config=cfg.model_dump(mode="json"),
        resume_step=run_state.step,
        total_steps=cfg.distillation.max_num_steps,
    )
    return run_state


def _check_models(
    cfg: DistillationConfig,
) -> tuple[PreTrainedTokenizerBase, dict[str, TeacherRendering]]:
    """The student's tokenizer and, by section, how each teacher whose tokenizer or chat
    template differs reads the student's text (_crossed), after checking the model configs
    against each other (vocabularies, tensor-parallel sizes, top-k) and that local model
    directories hold their weights; SetupError on a mismatch."""
    tokenizer = load_tokenizer(cfg.policy.tokenizer, "policy")
    local_teachers = {} if _is_served(cfg) else cfg.teacher_sections  # else: checked served
    student_config = load_model_config(cfg.policy, "policy")
    check_weights(cfg.policy, "policy")
    check_tensor_parallel(cfg.policy, student_config, "policy")
    renderings = {}
    for section, teacher in local_teachers.items():
        teacher_config = load_model_config(teacher, section)
        check_weights(teacher, section)
        rendering = _crossed(cfg, tokenizer, section, teacher_config.vocab_size)
        if rendering is None:
            check_vocab_sizes(student_config, teacher_config, len(tokenizer), section)
        else:
            renderings[section] = rendering
            if teacher_config.vocab_size < len(rendering.teacher):
                raise SetupError(
                    f"{section}.tokenizer ({len(rendering.teacher)} tokens) does not fit the "
                    f"vocabulary of {section}.model_name ({teacher_config.vocab_size} ids): a "
                    "teacher needs its own model's tokenizer"
                )
        check_tensor_parallel(teacher, teacher_config, section)
    if cfg.loss_fn.support != "teacher_topk" and cfg.named_teachers:  # self: the same model
        _check_full_vocabulary(cfg, student_config, renderings)
    has_teacher = cfg.named_teachers or cfg.self_teacher
    if has_teacher and cfg.distillation.topk_logits_k > student_config.vocab_size:
        raise SetupError(
            f"distillation.topk_logits_k ({cfg.distillation.topk_logits_k}) exceeds the "
            f"vocabulary size ({student_config.vocab_size})"
        )
    return tokenizer, renderings


def _check_full_vocabulary(cfg: DistillationConfig, student_config, renderings) -> None:
    """loss_fn.support full / student_topk compare the two models id by id: one tokenizer
    (no cross-tokenizer rendering) and one vocabulary size; SetupError otherwise."""
    support = f"loss_fn.support={cfg.loss_fn.support}"
    if renderings:
        raise SetupError(
            f"{support} compares teacher and student id by id, but the teacher reads the "
            "student's text with another tokenizer or chat template; use "
            "loss_fn.support=teacher_topk (the cross-tokenizer path)"
        )
    teacher_config = load_model_config(cfg.teacher, "teacher")
    if teacher_config.vocab_size != student_config.vocab_size:
        raise SetupError(
            f"{support} needs one vocabulary, but teacher.model_name has "
            f"{teacher_config.vocab_size} ids and policy.model_name {student_config.vocab_size}"
            "; use loss_fn.support=teacher_topk"
        )


def _crossed(
    cfg: DistillationConfig,
    tokenizer: PreTrainedTokenizerBase,
    section: str,
    teacher_vocab_size: int | None,
) -> TeacherRendering | None:
    """How the teacher of `section` (whose model has `teacher_vocab_size` ids; None for a
    served one) reads the student's text in its own tokens, when its tokenizer or chat template
    differs from the student's (printed); None when it reads the student's rows as they
    are."""
    teacher_cfg = cfg.teacher_sections[section]
    if teacher_cfg.tokenizer == cfg.policy.tokenizer:  # the same files and template
        return None
    teacher_tokenizer = load_tokenizer(teacher_cfg.tokenizer, section)
    student_kwargs = cfg.policy.tokenizer.chat_template_kwargs
    teacher_kwargs = teacher_cfg.tokenizer.chat_template_kwargs
    difference = tokenizer_difference(tokenizer, teacher_tokenizer, student_kwargs, teacher_kwargs)
    if difference is None:
        return None
    if teacher_cfg.prompt_template is not None:
        raise SetupError(
            f"{section}: {difference}; a teacher with another tokenizer or chat template cannot "
            f"take a prompt of its own ({section}.prompt_template) yet: unset one of them"
        )
    system_prompt = read_text_file(cfg.data.system_prompt_file, "data.system_prompt_file")
    teacher_formatter = ChatFormatter(
        teacher_tokenizer, template_kwargs=teacher_kwargs, tools=offered_tools(cfg)
    )
    rendering = TeacherRendering(
        tokenizer,
        teacher_formatter,
        teacher_vocab_size,
        system_prompt,
        # a served teacher refuses rows past its context; in-process ones score any length
        max_length=teacher_cfg.max_total_sequence_length if _is_served(cfg) else None,
    )
    rendering.check()
    vocab = rendering.vocab_map()
    unspellable = rendering.unspellable()
    print(
        f"{section}: {difference}: it reads the student's text in its own tokens and chat "
        f"template (docs/cross_tokenizer.md); {vocab.coverage():.1%} of its vocabulary maps to "
        "student tokens, the rest of its mass stays in the tail"
    )
    if unspellable:
        shown = ", ".join(repr(text) for text in unspellable[:5])
        raise SetupError(
            f"{section}: its tokenizer cannot write {len(unspellable)} of the student's tokens "
            f"(e.g. {shown}): it would read them as its unknown token; use a teacher whose "
            "tokenizer has byte fallback or a byte-level alphabet"
        )
    return rendering


def _privileged_template(cfg: DistillationConfig) -> str | None:
    """teacher.prompt_template (the teacher's own prompt), if there is a teacher with one."""
    return cfg.teacher.prompt_template if cfg.teacher is not None else None


def _privileged_context(
    cfg: DistillationConfig, formatter: ChatFormatter, prompt_sets: list[PromptSet]
) -> PrivilegedContext | None:
    """The teacher's own prompt (teacher.prompt_template), when it has one. Its rows are
    longer than the student's by what its opening adds; a served teacher's are checked to fit
    teacher.max_total_sequence_length, its server's context (SetupError if not: the server
    would refuse the longest rows mid-run). An in-process teacher scores them as they come."""
    template = _privileged_template(cfg)
    if template is None:
        return None
    context = PrivilegedContext(formatter, template)
    if not _is_served(cfg):
        return context
    samples = [sample for prompts in prompt_sets for sample in prompts.samples]
    growth, index = context.longest_growth(samples)
    longest = cfg.policy.max_total_sequence_length + max(0, growth)
    if longest > cfg.teacher.max_total_sequence_length:
        prompt = samples[index]["metadata"]["prompt"]
        raise SetupError(
            f"teacher.prompt_template makes the teacher's rows up to {longest} tokens "
            f"(policy.max_total_sequence_length {cfg.policy.max_total_sequence_length} plus "
            f"{growth} more in its opening of the prompt {prompt[:60]!r}), longer than "
            f"teacher.max_total_sequence_length ({cfg.teacher.max_total_sequence_length}), the "
            f"served teacher's context; set teacher.max_total_sequence_length={longest} and "
            "restart its server with that config (python -m nemo_opd.teacher_server uses it)"
        )
    return context


def _with_privileged_context(
    teacher: Teacher | None, context: PrivilegedContext | None, formatter: ChatFormatter
) -> Teacher | None:
    """The teacher, given its own prompt when it has one."""
    if teacher is None or context is None:
        return teacher
    return PrivilegedTeacher(teacher, context, formatter.tokenizer.pad_token_id)


def _is_served(cfg: DistillationConfig) -> bool:
    return cfg.teacher is not None and cfg.teacher.server.enabled


def _start_teachers(
    cfg: DistillationConfig,
    renderings: dict[str, TeacherRendering],
    workers: int,
    placement: PlacementGroup,
    threads: int | None,
) -> Teacher:
    """The in-process teacher's workers, or with several teachers one Policy each behind
    RoutedTeachers; the teachers split one teacher's share of every training bundle (threads:
    torch threads per worker on CPU, see overlap_threads)."""
    named = cfg.named_teachers
    teachers = {}
    for name, teacher in named.items():
        part = "teacher" if cfg.teachers is None else f"teacher.{name}"
        policy = Policy(
            teacher,
            cfg.cluster,
            optimizer=False,
            num_workers=workers,
            name=part,
            placement=placement,
            share=SHARE / len(named),
            wait=False,
            threads=threads,
        )
        section = "teacher" if cfg.teachers is None else f"teachers.{name}"
        teacher = InProcessTeacher(policy, part)
        rendering = renderings.get(section)
        if rendering is not None:  # its workers render and map their own rows
            teacher = CrossTokenizerTeacher(teacher, rendering, workers=policy)
        teachers[name] = teacher
    return teachers["teacher"] if cfg.teachers is None else RoutedTeachers(teachers)


def _served_teacher(cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase) -> Teacher:
    """The teacher behind teacher.server, checked against the live server (SetupError); one
    whose tokenizer or chat template differs from the student's reads the student's text in
    its own tokens (the server must tokenize as teacher.tokenizer does)."""
    rendering = _crossed(cfg, tokenizer, "teacher", None)
    server = cfg.teacher.server
    teacher = ServedTeacher(
        server.base_url,
        server.model_name or cfg.teacher.model_name,
        timeout_s=server.timeout_s,
        max_concurrency=server.max_concurrency,
        max_retries=server.max_retries,
        backoff_s=server.retry_backoff_s,
        rows_per_request=server.rows_per_request,
        api_key=server_api_key(server),
    )
    check_served_teacher(
        teacher,
        topk=cfg.distillation.topk_logits_k,
        max_sequence_length=cfg.teacher.max_total_sequence_length,
        tokenizer=tokenizer if rendering is None else rendering.teacher,
    )
    print(f"teacher: served by {teacher.shown_url} (model {teacher.model!r})")
    if rendering is None:
        return teacher
    return CrossTokenizerTeacher(teacher, rendering)


def offered_tools(cfg: DistillationConfig) -> list[dict] | None:
    """The tools env.tools offers, as the chat template takes them (None for none);
    SetupError for a tool that cannot be loaded."""
    try:
        return tool_schemas(cfg.env.tools.names)
    except ValueError as error:
        raise SetupError(f"env.tools.names: {error}") from None


def _load_prompts(
    cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase
) -> tuple[ChatFormatter, PromptSet, PromptSet]:
    """The chat formatter and the train and validation prompts, rendered with the chat template
    and tokenized (too-long prompts skipped and counted; no validation prompts when the run
    never validates); SetupError on bad data."""
    formatter = ChatFormatter(
        tokenizer,
        read_text_file(cfg.data.prompt_file, "data.prompt_file"),
        read_text_file(cfg.data.system_prompt_file, "data.system_prompt_file"),
        cfg.policy.tokenizer.chat_template_kwargs,
        tools=offered_tools(cfg),
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
    val = PromptSet([], 0)  # a run that never validates needs no validation data
    if cfg.distillation.validates:
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
    return _build_generation(cfg, device, split, placement, cfg.teacher)


def _resolve_model_paths(cfg: DistillationConfig) -> DistillationConfig:
    """The config with "tiny:*" model and tokenizer names replaced by local directories (not a
    served teacher's model name: it is the one the server knows, and no model is loaded
    here)."""
    update = {"policy": cfg.policy.with_names(resolve_pretrained)}
    if cfg.teacher is not None:
        update["teacher"] = cfg.teacher.with_names(resolve_pretrained, model=not _is_served(cfg))
    if cfg.teachers is not None:
        update["teachers"] = {
            name: teacher.with_names(resolve_pretrained) for name, teacher in cfg.teachers.items()
        }
    return cfg.model_copy(update=update)


def rollouts_per_step(cfg: DistillationConfig) -> int:
    """Conversations sampled per step: prompts x generations per prompt."""
    return cfg.distillation.num_prompts_per_step * cfg.distillation.num_generations_per_prompt


def _optimizer_steps_per_step(cfg: DistillationConfig) -> int:
    return rollouts_per_step(cfg) // cfg.policy.train_global_batch_size


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
    while it generates), half of them with max_staleness > 0 (overlap_threads)."""
    gen_cfg = cfg.policy.generation
    colocated = device == "cuda" and gen_cfg.colocated.enabled
    cores = cfg.cluster.cpus_per_worker * cfg.cluster.gpus_per_node
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
    )


def overlap_threads(cfg: DistillationConfig, device: str, cores: int | None = None) -> int | None:
    """Threads of a CPU process that holds `cores` (default cluster.cpus_per_worker) when
    max_staleness > 0: half of them, at least 1, since generation, the teacher and training
    then run at once on the same cores (each on its full share, their OpenMP threads would
    spin against each other: a tiny step took 5x longer). None otherwise (all of them)."""
    if device != "cpu" or cfg.distillation.max_staleness == 0:
        return None
    return max(1, (cores or cfg.cluster.cpus_per_worker) // 2)


def _reserve_workers(cfg: DistillationConfig, device: str) -> PlacementGroup:
    """The placement group of the run: cluster.num_nodes nodes chosen (SetupError when the
    cluster lacks them), checked to see the paths the workers use, and one bundle per worker
    pinned to its node (placement.bundle_node_slots)."""
    resources = WorkerResources(device, cfg.cluster.cpus_per_worker)
    nodes = choose_nodes(cfg.cluster, resources)
    check_shared_paths(paths_workers_use(cfg), nodes)
    slots = bundle_node_slots(cfg.cluster)
    return build_placement_group(len(slots), resources, nodes=[nodes[s].node_id for s in slots])


def _describe_workers(cfg: DistillationConfig, device: str, split: WorkerSplit) -> str:
    """One line for the start of a run: the workers it is about to place (the training workers
    and what runs on them, the vLLM engines and where); _report_placement says where Ray put
    each once they have started."""
    engines = len(generation_bundles(cfg.cluster, split, cfg.policy.generation, device))
    models = "the student"
    if cfg.named_teachers and not _is_served(cfg):
        models += " and of the teacher" if cfg.teachers is None else " and of each teacher"
    if device == "cpu":
        where = "sharing the training workers' CPUs"
    elif cfg.policy.generation.colocated.enabled:
        where = "colocated: each shares a training worker's GPU"
    else:
        where = "on GPUs of their own"
    return (
        f"workers: {_count(split.training, 'training worker')} (each runs a rank of {models}) "
        f"on {_count(cfg.cluster.num_nodes, 'node')}, {_count(engines, 'vLLM engine')} "
        f"({where}); where Ray placed each is printed once they have started"
    )


def _count(number: int, noun: str) -> str:
    """'1 node', '2 nodes'."""
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


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
        return distillation_loss(cfg)
    if cfg.objective.loss == "sft":
        return NLLLossFn()
    divergence = distillation_loss(cfg) if cfg.objective.topk_kl_coef > 0 else None
    return PolicyGradientLossFn.from_config(
        cfg.objective, cfg.loss_fn, temperature=sampling_temperature(cfg), topk_kl=divergence
    )


def distillation_loss(cfg: DistillationConfig) -> DistillationLossFn | FullVocabDistillationLossFn:
    """The divergence of loss_fn over its support: the teacher's top-k (DistillationLossFn),
    or the full vocabulary / the student's top-k from the teacher's hidden states."""
    if cfg.loss_fn.support == "teacher_topk":
        return DistillationLossFn.from_config(cfg.loss_fn)
    return FullVocabDistillationLossFn.from_config(
        cfg.loss_fn, k=cfg.distillation.topk_logits_k, teacher_temperature=teacher_temperature(cfg)
    )


def sampling_temperature(cfg: DistillationConfig) -> float:
    """The temperature vLLM samples at (and the policy-gradient loss scores at)."""
    return cfg.policy.generation.temperature or 1.0


def teacher_temperature(cfg: DistillationConfig) -> float:
    """The teacher's temperature: distillation.teacher_temperature, else the loss's."""
    return cfg.distillation.teacher_temperature or cfg.loss_fn.temperature


def _print_temperatures(cfg: DistillationConfig) -> None:
    objective = cfg.objective
    student = cfg.loss_fn.temperature
    if objective.loss == "policy_gradient":
        student = sampling_temperature(cfg)
    teacher = f", teacher {teacher_temperature(cfg)}" if objective.uses_teacher else ""
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
    state.loader_position = saved["state"]["loader"]
    state.step = state.resumed_step = int(saved["step"])
    if saved["state"].get(ROLLOUTS_AHEAD_KEY):
        ahead = torch.load(path / ROLLOUTS_AHEAD_FILE, weights_only=True)
        state.saved_rollouts = {int(s): rollout_from_state(r) for s, r in ahead.items()}
    state.generation_version = -1  # vLLM holds the initial weights: refit before sampling
    state.last_metrics = dict(saved.get("metrics", {}))
    print(f"resumed from {path} (step {state.step})")
