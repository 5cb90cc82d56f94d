"""Cross-field checks of a validated DistillationConfig (the loader runs them, validate_config).

Each check yields (or returns) the config's problems, one message each, naming the full key
paths involved and their values. The first paragraph of each check's docstring is the rule as
listed in docs/config.md. CHECKS lists them all, in the order they run; a few live beside the
syntax or arithmetic they use (address.py, templates.py, worker_split.py). What only setup can
check (the tokenizers) nemo_opd.config_reference lists after them.
"""

import importlib.util
import re
from collections.abc import Callable, Iterable, Iterator

from nemo_opd.config.address import check_cluster_address
from nemo_opd.config.errors import show, suggest
from nemo_opd.config.executor import check_executor
from nemo_opd.config.model_schema import PolicyConfig
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.config.self_teacher_checks import check_self_teacher
from nemo_opd.config.templates import check_privileged_teacher, check_prompt_file
from nemo_opd.config.worker_split import check_generation_placement, worker_split
from nemo_opd.tools.base import BUILTIN_TOOLS

# -------- the models, their backends and the cluster ----------------------------------------------


def _models(
    cfg: DistillationConfig, one_backend: bool = False
) -> Iterator[tuple[str, PolicyConfig]]:
    """(key path, section) for the student and every teacher; with `one_backend` only those
    with exactly one backend enabled (check_one_backend reports the others)."""
    for name, model in [("policy", cfg.policy), *cfg.teacher_sections.items()]:
        if not one_backend or model.dtensor_cfg.enabled != model.megatron_cfg.enabled:
            yield name, model


def _training_world(cfg: DistillationConfig) -> int | None:
    """Workers that train, or None when the generation placement is itself invalid."""
    split = worker_split(cfg.cluster, cfg.policy.generation)
    return split.training if split else None


def check_one_backend(cfg: DistillationConfig) -> Iterator[str]:
    """Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled, for policy and for teacher."""
    yield from (
        f"{name}.dtensor_cfg.enabled and {name}.megatron_cfg.enabled are "
        f"{'both true' if model.dtensor_cfg.enabled else 'both false'}; enable exactly one "
        "training backend"
        for name, model in _models(cfg)
        if model.dtensor_cfg.enabled == model.megatron_cfg.enabled
    )


def check_backend_features_available(cfg: DistillationConfig) -> Iterator[str]:
    """Backend features not implemented yet are off: sequence_parallel (both backends), and for
    Megatron pipeline and expert parallel and the distributed optimizer."""
    for name, model in _models(cfg, one_backend=True):
        section = getattr(model, f"{model.backend}_cfg")
        wanted = {"sequence_parallel": section.sequence_parallel}
        if model.backend == "megatron":
            wanted["pipeline_model_parallel_size"] = section.pipeline_model_parallel_size > 1
            wanted["expert_model_parallel_size"] = section.expert_model_parallel_size > 1
            wanted["distributed_optimizer"] = section.distributed_optimizer
        yield from (
            f"{name}.{model.backend}_cfg.{key} is not supported yet by the {model.backend} "
            f"backend; set it to {'false' if isinstance(getattr(section, key), bool) else '1'}"
            for key, used in wanted.items()
            if used
        )


def check_shared_prefix_scoring(cfg: DistillationConfig) -> Iterator[str]:
    """dtensor_cfg.shared_prefix_scoring only on the DTensor backend, without context
    parallelism (whose ranks each hold a slice of a row: a prefix and its suffixes would span
    ranks)."""
    for name, model in _models(cfg, one_backend=True):
        dtensor = model.dtensor_cfg
        if not dtensor.shared_prefix_scoring:
            continue
        if model.backend != "dtensor":
            yield (
                f"{name}.dtensor_cfg.shared_prefix_scoring is a DTensor backend option, and "
                f"{name} runs on {model.backend}; set it to false"
            )
        elif dtensor.context_parallel_size > 1:
            yield (
                f"{name}.dtensor_cfg.shared_prefix_scoring is not supported with "
                f"context_parallel_size {dtensor.context_parallel_size}; set it to false, or "
                "context_parallel_size to 1"
            )


def check_policy_trains_teacher_frozen(cfg: DistillationConfig) -> Iterator[str]:
    """The policy has an optimizer and a generation section; the teacher has neither (it is
    frozen and does not sample), nor a scheduler."""
    yield from (
        f"policy.{key} is required (the student trains and generates)"
        for key in ("optimizer", "generation")
        if getattr(cfg.policy, key) is None
    )
    for path, teacher in cfg.teacher_sections.items():
        yield from (
            f"{path}.{key} must be null: the teacher is frozen and never samples"
            for key in ("optimizer", "scheduler", "generation")
            if getattr(teacher, key) is not None
        )


def check_lora(cfg: DistillationConfig) -> Iterator[str]:
    """LoRA is for the student on the DTensor backend: megatron_cfg and teachers refuse it, and
    lora.dropout needs tensor_parallel_size 1."""
    lora, tp = cfg.policy.lora, cfg.policy.dtensor_cfg.tensor_parallel_size
    if lora.enabled and lora.dropout > 0 and tp > 1:
        yield (
            f"policy.lora.dropout ({lora.dropout}) with policy.dtensor_cfg.tensor_parallel_size "
            f"{tp} is not supported yet: each tensor-parallel rank would draw its own dropout "
            "mask for the adapter factor they share; set policy.lora.dropout=0 or "
            "tensor_parallel_size=1"
        )
    if lora.enabled and cfg.policy.backend == "megatron":
        yield (
            "policy.lora.enabled is true with policy.megatron_cfg.enabled: LoRA students run on "
            "the DTensor backend only (megatron-core ships no adapter layers); set "
            "policy.megatron_cfg.enabled=false and policy.dtensor_cfg.enabled=true, or "
            "policy.lora.enabled=false"
        )
    yield from (
        f"{path}.lora.enabled must be false: the teacher is frozen, and adapters are for the "
        "trained student (policy.lora)"
        for path, teacher in cfg.teacher_sections.items()
        if teacher.lora.enabled
    )


def overlap_problem(cfg: DistillationConfig, device: str) -> str | None:
    """Why distillation.max_staleness > 0 cannot overlap on `device` ("cuda" or "cpu"), or None:
    generation colocated with training on the same GPUs sleeps while training runs, so the two
    take turns whatever the schedule. On CPU generation and training share the cores by
    design (they run at once, each on fewer of them)."""
    generation, staleness = cfg.policy.generation, cfg.distillation.max_staleness
    colocated = generation is not None and generation.colocated.enabled
    if staleness == 0 or device != "cuda" or not colocated:
        return None
    return (
        f"distillation.max_staleness is {staleness}, but vLLM is colocated with training "
        "(policy.generation.colocated.enabled true): its engines sleep while training holds the "
        "GPUs, so nothing can overlap; give generation GPUs of its own (colocated.enabled false "
        "and colocated.resources) or set max_staleness to 0"
    )


def check_overlap(cfg: DistillationConfig) -> Iterator[str]:
    """max_staleness > 0 needs generation on GPUs of its own (cluster.device cuda; "auto" is
    checked at setup, when the device is known); stream_chunks splits the step's prompts."""
    problem, loop = overlap_problem(cfg, cfg.cluster.device), cfg.distillation
    if problem:
        yield problem
    if loop.stream_chunks > loop.num_prompts_per_step:
        yield (
            f"distillation.stream_chunks ({loop.stream_chunks}) is more than "
            f"num_prompts_per_step ({loop.num_prompts_per_step}): each part holds whole "
            "prompts; lower it"
        )


def check_parallel_sizes_divide_world(cfg: DistillationConfig) -> Iterator[str]:
    """tensor x context (x pipeline for Megatron) parallel sizes divide the training workers,
    cluster.num_nodes x cluster.gpus_per_node (less non-colocated generation workers)."""
    world = _training_world(cfg)
    if world is None:
        return  # reported by check_generation_placement
    for name, model in _models(cfg, one_backend=True):
        prefix, megatron = f"{name}.{model.backend}_cfg", model.backend == "megatron"
        sizes = f"tensor {model.tensor_parallel_size} x context {model.context_parallel_size}"
        sizes += f" x pipeline {model.pipeline_parallel_size}" if megatron else ""
        if world % model.model_parallel_size:
            yield (
                f"{prefix}: model-parallel size ({sizes} = {model.model_parallel_size}) must "
                f"divide the {world} training workers (cluster.num_nodes x cluster.gpus_per_node)"
            )
            continue
        expert = model.megatron_cfg.expert_model_parallel_size
        expert_group = model.tensor_parallel_size * model.pipeline_parallel_size * expert
        if megatron and expert > 1 and world % expert_group:
            yield (
                f"{prefix}.expert_model_parallel_size ({expert}) x tensor x pipeline "
                f"(= {expert_group}) must divide the {world} training workers"
            )


def check_model_parallel_within_node(cfg: DistillationConfig) -> Iterator[str]:
    """On several nodes, tensor x context parallel groups fit inside a node: their size divides
    cluster.gpus_per_node (ranks fill a node before the next, so data parallel spans nodes)."""
    per_node = cfg.cluster.gpus_per_node
    if cfg.cluster.num_nodes == 1:
        return
    yield from (
        f"{name}: tensor x context parallel size ({model.tensor_parallel_size} x "
        f"{model.context_parallel_size} = {group}) must divide cluster.gpus_per_node "
        f"({per_node}) on several nodes: each group's collectives run at every layer and stay "
        "inside one node"
        for name, model in _models(cfg, one_backend=True)
        if not (getattr(model, "server", None) is not None and model.server.enabled)
        and per_node % (group := model.tensor_parallel_size * model.context_parallel_size)
    )


def check_global_batch_divisible(cfg: DistillationConfig) -> Iterator[str]:
    """policy.train_global_batch_size is a multiple of train_micro_batch_size x the
    data-parallel size (training workers / model-parallel size)."""
    world, policy = _training_world(cfg), cfg.policy
    one_backend = policy.dtensor_cfg.enabled != policy.megatron_cfg.enabled
    # an invalid placement or model-parallel size is reported by the checks above
    if world is None or not one_backend or world % policy.model_parallel_size:
        return
    data_parallel = world // policy.model_parallel_size
    step = policy.train_micro_batch_size * data_parallel
    if policy.train_global_batch_size % step:
        yield (
            f"policy.train_global_batch_size ({policy.train_global_batch_size}) must be a "
            f"multiple of policy.train_micro_batch_size x data-parallel size "
            f"({policy.train_micro_batch_size} x {data_parallel} = {step})"
        )


def check_rollouts_fill_global_batches(cfg: DistillationConfig) -> Iterator[str]:
    """distillation.num_prompts_per_step x num_generations_per_prompt is a multiple of
    policy.train_global_batch_size.

    A step's rollouts are split into global batches of train_global_batch_size, one optimizer
    step each; a remainder would either be thrown away or make a smaller batch whose gradient
    has a different scale.
    """
    loop, batch = cfg.distillation, cfg.policy.train_global_batch_size
    rollouts = loop.num_prompts_per_step * loop.num_generations_per_prompt
    if rollouts % batch:
        yield (
            f"distillation.num_prompts_per_step x distillation.num_generations_per_prompt "
            f"({loop.num_prompts_per_step} x {loop.num_generations_per_prompt} = {rollouts}) "
            f"must be a multiple of policy.train_global_batch_size ({batch})"
        )


# -------- sequences and microbatches --------------------------------------------------------------


def check_microbatching(cfg: DistillationConfig) -> Iterator[str]:
    """sequence_packing and dynamic_batching are not both enabled; when one is, its token
    budgets are set and at least max_total_sequence_length (so that any sequence fits)."""
    for name, model in _models(cfg):
        if model.sequence_packing.enabled and model.dynamic_batching.enabled:
            yield (
                f"{name}.sequence_packing.enabled and {name}.dynamic_batching.enabled are both "
                "true; enable at most one"
            )
        # The teacher never trains, so only its log-prob budget matters.
        budgets = ["train_mb_tokens"] if name == "policy" else []
        for scheme in ("sequence_packing", "dynamic_batching"):
            section, key = getattr(model, scheme), f"{name}.{scheme}"
            for budget in [*budgets, "logprob_mb_tokens"] if section.enabled else []:
                tokens, longest = getattr(section, budget), model.max_total_sequence_length
                if tokens is None:
                    yield f"{key}.{budget} must be set when {key}.enabled is true"
                elif tokens < longest:
                    yield (
                        f"{key}.{budget} ({tokens}) must be at least max_total_sequence_length "
                        f"({longest}), or the longest sequences cannot fit in a microbatch"
                    )


def check_sequence_length_divisibility(cfg: DistillationConfig) -> Iterator[str]:
    """make_sequence_length_divisible_by is a multiple of the tensor-parallel size where
    sequence_parallel is on (which is refused for now, so this only adds to that message). The
    context-parallel size needs no setting: the engines pad to a multiple of
    lcm(make_sequence_length_divisible_by, cp)."""
    yield from (
        f"{name}.make_sequence_length_divisible_by ({model.make_sequence_length_divisible_by}) "
        "must be a multiple of the tensor-parallel size (sequence_parallel) of "
        f"{name}.{model.backend}_cfg ({model.tensor_parallel_size})"
        for name, model in _models(cfg, one_backend=True)
        if getattr(model, f"{model.backend}_cfg").sequence_parallel
        and model.make_sequence_length_divisible_by % model.tensor_parallel_size
    )


def check_sequence_lengths(cfg: DistillationConfig) -> Iterator[str]:
    """Generated and prompt lengths fit in policy.max_total_sequence_length, and the teacher
    can score every rollout (its max_total_sequence_length is at least the policy's)."""
    longest, generation = cfg.policy.max_total_sequence_length, cfg.policy.generation
    if generation is not None:
        yield from (
            f"policy.generation.{key} ({value}) must be at most "
            f"policy.max_total_sequence_length ({longest})"
            for key, value in [
                ("max_new_tokens", generation.max_new_tokens),
                ("vllm_cfg.max_model_len", generation.vllm_cfg.max_model_len),
            ]
            if value > longest
        )
    prompt = cfg.data.max_input_seq_length
    if prompt is not None and prompt >= longest:
        yield (
            f"data.max_input_seq_length ({prompt}) must be less than "
            f"policy.max_total_sequence_length ({longest}) to leave room for a response"
        )
    yield from (
        f"{path}.max_total_sequence_length ({teacher.max_total_sequence_length}) must be at "
        f"least policy.max_total_sequence_length ({longest}) to score whole rollouts"
        for path, teacher in cfg.teacher_sections.items()
        if teacher.max_total_sequence_length < longest
    )


# -------- the objective and the data it trains on -------------------------------------------------


def check_objective(cfg: DistillationConfig) -> Iterator[str]:
    """A teacher is configured exactly when an objective term uses one; a policy-gradient
    objective has a nonzero advantage term and samples at a temperature above 0; GRPO and RLOO
    have at least 2 generations per prompt; topk_kl and sft use no policy-gradient key."""
    objective, teachers = cfg.objective, cfg.teacher_sections or cfg.self_teacher
    if objective.uses_teacher and not teachers:
        yield (
            f"objective.loss is {objective.loss!r} with a term that needs the teacher (loss "
            "topk_kl, objective.opd_coef > 0 or objective.topk_kl_coef > 0), but teacher is "
            "null; configure a teacher section"
        )
    if not objective.uses_teacher and teachers:
        section = "teachers" if cfg.teachers is not None else "teacher"
        yield (
            f"{section} is configured but no objective term uses it (objective.loss "
            f"{objective.loss!r}, opd_coef {objective.opd_coef}, topk_kl_coef "
            f"{objective.topk_kl_coef}); set {section} to null ({section}=null on the command "
            "line)"
        )
    if objective.loss != "policy_gradient":  # the advantage keys set away from off do nothing
        unused = [
            f"objective.{key} ({getattr(objective, key)!r})"
            for key in ("opd_coef", "reward_estimator", "topk_kl_coef")
            if getattr(objective, key) not in (0.0, "none")
        ]
        if unused:
            yield (
                f"{', '.join(unused)} only apply to objective.loss 'policy_gradient', but it is "
                f"{objective.loss!r}; set objective.loss=policy_gradient or leave them at 0 / none"
            )
        return
    if objective.opd_coef == 0 and not objective.uses_reward:
        yield (
            "objective.loss is 'policy_gradient' but every advantage term is off (opd_coef 0, "
            f"reward_estimator {objective.reward_estimator!r}, reward_coef "
            f"{objective.reward_coef}); set objective.opd_coef > 0, or a reward_estimator with "
            "reward_coef > 0 (or objective.loss=topk_kl for the top-k divergence alone)"
        )
    generations = cfg.distillation.num_generations_per_prompt
    if objective.uses_reward and objective.reward_estimator in ("grpo", "rloo") and generations < 2:
        yield (
            f"objective.reward_estimator {objective.reward_estimator!r} compares the samples of "
            "one prompt, so distillation.num_generations_per_prompt must be at least 2 (it is "
            f"{generations})"
        )
    if cfg.policy.generation is not None and cfg.policy.generation.temperature == 0:
        yield (
            "objective.loss 'policy_gradient' needs sampled rollouts: "
            "policy.generation.temperature must be above 0"
        )


def check_data_source(cfg: DistillationConfig) -> Iterator[str]:
    """Exactly one of data.dataset_name and data.train_path is set, and at most one of
    data.val_path and data.val_dataset_name."""
    data = cfg.data
    if (data.dataset_name is None) == (data.train_path is None):
        state = "both set" if data.dataset_name is not None else "both null"
        yield f"data.dataset_name and data.train_path are {state}; set exactly one"
    if data.val_path is not None and data.val_dataset_name is not None:
        yield (
            "data.val_path and data.val_dataset_name are both set; set one: a local file, or a "
            "dataset (null: data.dataset_name's own validation split)"
        )


def check_data_mix(cfg: DistillationConfig) -> Iterator[str]:
    """Off-policy steps (distillation.lmbda < 1, and every step of objective.loss sft) need
    data.response_key, or distillation.seq_kd with a teacher that can sample (in-process, top-k
    objective); sft trains on the responses only (lmbda 0) and
    policy_gradient on the student's own samples only (lmbda 1)."""
    lmbda, loss = cfg.distillation.lmbda, cfg.objective.loss
    if loss == "sft" and lmbda not in (None, 0.0):
        yield (
            f"objective.loss 'sft' trains on the dataset's responses only, but distillation.lmbda "
            f"is {lmbda} (the share of on-policy steps); leave it null or set it to 0"
        )
    if loss == "policy_gradient" and lmbda not in (None, 1.0):
        yield (
            f"objective.loss 'policy_gradient' learns from the student's own samples (its "
            f"importance weights and advantages need them), but distillation.lmbda is {lmbda}; "
            "leave it null or set it to 1"
        )
    off_policy = loss == "sft" or (lmbda is not None and lmbda < 1)
    if cfg.distillation.seq_kd:
        yield from _seq_kd_problems(cfg, off_policy)
    elif off_policy and cfg.data.response_key is None:
        what = "objective.loss 'sft'" if loss == "sft" else f"distillation.lmbda {lmbda}"
        yield (
            f"{what} trains on the dataset's responses, but data.response_key is null; set it "
            "to the column holding them (tiny_math: solution)"
        )


def _seq_kd_problems(cfg: DistillationConfig, off_policy: bool) -> Iterator[str]:
    """What distillation.seq_kd needs: off-policy steps, a teacher that can sample (one the run
    starts, not a served one) and a top-k objective (colocated CUDA generation, which has no
    room for a second engine yet, is refused at setup, once the device is known)."""
    if not off_policy:
        yield (
            "distillation.seq_kd samples the off-policy steps' responses from the teacher, but "
            "every step is on-policy (distillation.lmbda is 1 or null); set distillation.lmbda "
            "below 1"
        )
    if cfg.objective.loss == "sft":
        yield (
            "distillation.seq_kd with objective.loss 'sft' is not supported yet; use "
            "objective.loss topk_kl (the teacher grades its own samples, as TRL's seq_kd)"
        )
    if cfg.teachers is not None:
        yield (
            "distillation.seq_kd with several teachers is not supported yet (which one would "
            "sample?); use one teacher for seq_kd"
        )
    elif cfg.teacher is None:
        yield "distillation.seq_kd samples from the teacher, but teacher is null"
    elif cfg.teacher.server.enabled:
        yield (
            "distillation.seq_kd cannot sample from a served teacher yet "
            "(teacher.server.enabled); run the teacher in-process for seq_kd"
        )


# -------- teachers --------------------------------------------------------------------------------


TEACHER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A name of `teachers` (it becomes part of metric names, teacher/<name>/...)."""


def check_routed_teachers(cfg: DistillationConfig) -> Iterator[str]:
    """`teachers` (several, by name) replaces `teacher` and needs data.teacher_key; names are
    1-64 letters, digits, `_`, `.` or `-`; every data.teacher_routes value names a teacher;
    a routed teacher is not served and has no prompt_template yet."""
    data, teachers = cfg.data, cfg.teachers
    if teachers is None:
        yield from (
            f"data.{key} routes prompts to several teachers, but teachers is null; configure "
            f"teachers (a section per teacher, by name) or set data.{key} to null"
            for key in ("teacher_key", "teacher_routes")
            if getattr(data, key) is not None
        )
        return
    if cfg.teacher is not None:
        yield (
            "teacher and teachers are both set; set teacher (one teacher) or teachers (several, "
            "routed by data.teacher_key), not both"
        )
    if not teachers:
        yield "teachers is empty; name at least one teacher, or set teachers to null"
    if data.teacher_key is None:
        yield (
            "teachers (several teachers) needs data.teacher_key: the column that names each "
            "prompt's teacher (or a key of data.teacher_routes)"
        )
    bad_names = [name for name in teachers if not TEACHER_NAME.fullmatch(name)]
    if bad_names:
        yield (
            f"teachers: the names {bad_names} are not 1-64 letters, digits, '_', '.' or '-' "
            "(they name the teacher's metrics); rename them"
        )
    yield from (
        f"data.teacher_routes.{value} routes to {name!r}, which is not a teacher; teachers has "
        f"{sorted(teachers)}"
        for value, name in (data.teacher_routes or {}).items()
        if name not in teachers
    )
    for name, teacher in teachers.items():
        if teacher.server.enabled:
            yield (
                f"teachers.{name}.server.enabled: a served teacher among several teachers is "
                "not supported yet; run it in-process, or use one served teacher (teacher)"
            )
        if teacher.prompt_template is not None:
            yield (
                f"teachers.{name}.prompt_template: privileged context with several teachers is "
                "not supported yet; use one teacher (teacher) for it"
            )


def check_served_teacher(cfg: DistillationConfig) -> Iterator[str]:
    """A served teacher (teacher.server) scores at temperature 1 only."""
    if cfg.teacher is None or not cfg.teacher.server.enabled:
        return
    temperature = cfg.distillation.teacher_temperature or cfg.loss_fn.temperature
    if temperature != 1.0:
        yield (
            f"teacher.server.enabled needs the teacher at temperature 1 (vLLM computes prompt "
            f"log-probs from the raw logits), but distillation.teacher_temperature / "
            f"loss_fn.temperature give {temperature:g}"
        )


def check_loss_support(cfg: DistillationConfig) -> Iterator[str]:
    """loss_fn.support full and student_topk need one teacher run by the run's workers (not
    served, not routed) and a divergence term: the topk_kl objective, or policy_gradient with
    topk_kl_coef > 0."""
    support, objective = cfg.loss_fn.support, cfg.objective
    if support == "teacher_topk":
        return
    why = f"loss_fn.support={support} (the teacher's hidden states and LM head)"
    if objective.loss == "sft" or (objective.loss == "policy_gradient" and not objective.uses_topk):
        yield (
            f"{why} chooses the ids of the divergence term, which objective.loss="
            f"{objective.loss} does not have (policy_gradient: set objective.topk_kl_coef > 0); "
            "or set loss_fn.support=teacher_topk"
        )
    if cfg.teachers is not None:
        yield f"{why} needs one teacher; `teachers` names {len(cfg.teachers)}"
    elif cfg.teacher is not None and cfg.teacher.server.enabled:
        yield (
            f"{why} needs a teacher run by the run's own workers: a served teacher "
            "(teacher.server.enabled) returns no hidden states"
        )


# -------- checkpoints, logging and tools ----------------------------------------------------------


def check_checkpointing(cfg: DistillationConfig) -> Iterator[str]:
    """checkpointing.keep_top_k is at least 1 when enabled; ranking by a validation/ metric
    needs validation at every save (save_period a multiple of distillation.val_period)."""
    ckpt, val_period = cfg.checkpointing, cfg.distillation.val_period
    if not ckpt.enabled:
        return
    if ckpt.keep_top_k is not None and ckpt.keep_top_k < 1:
        yield (
            f"checkpointing.keep_top_k ({ckpt.keep_top_k}) must be at least 1 when "
            "checkpointing.enabled is true (null keeps all)"
        )
        return
    ranked_by_validation = (ckpt.metric_name or "").startswith("validation/")
    stale = val_period == 0 or ckpt.save_period % val_period
    if ckpt.keep_top_k is not None and ranked_by_validation and stale:
        yield (
            f"checkpointing.metric_name is {ckpt.metric_name!r}, so checkpointing.save_period "
            f"({ckpt.save_period}) must be a multiple of distillation.val_period ({val_period}, "
            "0 means never) for every checkpoint to have a fresh metric; or set "
            "checkpointing.metric_name to null to keep the most recent"
        )


VALIDATION_DIVERGENCE = ("loss", "forward_kl", "reverse_kl", "top1_agreement")
"""The validation divergence's metrics, validation/<name> (and per routed teacher
validation/teacher/<teacher>/<name>), which algorithms/distillation.py logs."""
NEMO_RL_PREFIXES = {"val:": "validation/", "train:": "train/"}
"""NeMo-RL's metric prefixes (checkpointing.metric_name: val:accuracy) and ours."""


def checkpoint_metrics(cfg: DistillationConfig) -> list[str]:
    """The metrics checkpointing.metric_name may rank checkpoints by: what a step that validates
    logs (algorithms/distillation.py's validate: accuracy and length; the divergence with a
    teacher, per routed teacher too; avg@k and pass@k with val_samples_per_prompt k), then
    train/loss and train/reward."""
    names = ["validation/accuracy", "validation/avg_length"]
    k = cfg.distillation.val_samples_per_prompt
    if k:
        names += [f"validation/accuracy_avg@{k}", f"validation/pass@{k}"]
    if cfg.named_teachers or cfg.self_teacher:
        names += [f"validation/{name}" for name in VALIDATION_DIVERGENCE]
    for teacher in cfg.teachers or {}:
        names += [
            f"validation/teacher/{teacher}/{name}" for name in ("accuracy", *VALIDATION_DIVERGENCE)
        ]
    return names + ["train/loss", "train/reward"]


def check_checkpoint_metric(cfg: DistillationConfig) -> Iterator[str]:
    """checkpointing.metric_name names a metric the run logs (checkpoint_metrics), or is null;
    NeMo-RL's spelling (val:accuracy) is refused with ours (validation/accuracy)."""
    name = cfg.checkpointing.metric_name
    known = checkpoint_metrics(cfg)
    if not cfg.checkpointing.enabled or name is None or name in known:
        return
    hint = suggest(name, known)
    for theirs, ours in NEMO_RL_PREFIXES.items():
        spelled = ours + name.removeprefix(theirs)
        if name.startswith(theirs) and spelled in known:
            hint = f"; NeMo-RL's {show(name)} is {show(spelled)} here"
    yield (
        f"checkpointing.metric_name: {show(name)} is not a metric checkpoints are ranked by"
        f"{hint}; the metrics are {', '.join(known)}; or null to keep the most recent"
    )


def check_wandb_installed(cfg: DistillationConfig) -> Iterator[str]:
    """logger.wandb_enabled needs the wandb package (the `wandb` extra), checked when the config
    loads instead of after the whole setup."""
    if cfg.logger.wandb_enabled and importlib.util.find_spec("wandb") is None:
        yield (
            "logger.wandb_enabled is true but the wandb package is not installed: install the "
            "extra (uv sync --extra wandb, or pip install 'nemo_opd[wandb]'), or set "
            "logger.wandb_enabled=false"
        )


TOOL_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""A tool named by where it lives: "package.module:attribute"."""


def check_tools(cfg: DistillationConfig) -> Iterator[str]:
    """env.tools.names: each a built-in tool or "package.module:attribute", named once; a
    tool's result is read in a later turn, so distillation.max_rollout_turns is at least 2."""
    names = cfg.env.tools.names
    if not names:
        return
    yield from (
        f"env.tools.names: {name!r} is neither a built-in tool ({', '.join(sorted(BUILTIN_TOOLS))})"
        " nor 'package.module:attribute'"
        for name in names
        if name not in BUILTIN_TOOLS and not TOOL_SPEC.fullmatch(name)
    )
    if len(set(names)) < len(names):
        yield "env.tools.names: a tool is named twice"
    if cfg.distillation.max_rollout_turns < 2:
        yield (
            "env.tools.names offers tools, but distillation.max_rollout_turns is 1: the model "
            "reads a tool's result in its next turn; set it to 2 or more"
        )


CHECKS: tuple[Callable[[DistillationConfig], Iterable[str]], ...] = (
    check_one_backend,
    check_backend_features_available,
    check_policy_trains_teacher_frozen,
    check_lora,
    check_generation_placement,
    check_parallel_sizes_divide_world,
    check_model_parallel_within_node,
    check_cluster_address,
    check_executor,
    check_global_batch_divisible,
    check_rollouts_fill_global_batches,
    check_microbatching,
    check_sequence_length_divisibility,
    check_sequence_lengths,
    check_objective,
    check_data_source,
    check_data_mix,
    check_privileged_teacher,
    check_prompt_file,
    check_routed_teachers,
    check_checkpointing,
    check_checkpoint_metric,
    check_wandb_installed,
    check_served_teacher,
    check_loss_support,
    check_overlap,
    check_tools,
    check_self_teacher,
    check_shared_prefix_scoring,
)


def find_problems(cfg: DistillationConfig) -> list[str]:
    """Run every check; return all problems found (empty when the config is consistent)."""
    return [problem for check in CHECKS for problem in check(cfg)]
