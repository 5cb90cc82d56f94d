"""Cross-field checks, run when a DistillationConfig is validated.

Each check takes the whole config and returns a list of problems, one message per problem,
naming the full key paths involved and their values. The first line of each check's docstring
is the rule as listed in docs/config.md.

Not checked here, because the information only exists at setup: whether teacher and student
share a tokenizer and chat template (where they do not, the teacher reads the student's text in
its own tokens: nemo_opd.teachers.cross_tokenizer), and that distillation.topk_logits_k is at
most the vocabulary size.
"""

import importlib.util
import re
import string
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from nemo_opd.config.address import address_problem
from nemo_opd.config.errors import show, suggest
from nemo_opd.config.self_teacher_checks import check_self_teacher
from nemo_opd.config.templates import read_template_file, template_problem
from nemo_opd.config.worker_split import worker_split
from nemo_opd.tools.base import BUILTIN_TOOLS

if TYPE_CHECKING:  # the schema runs these checks when it validates: no import back at run time
    from nemo_opd.config.schema import DistillationConfig, PolicyConfig, TeacherConfig


def _teachers(cfg: "DistillationConfig") -> list[tuple[str, "TeacherConfig"]]:
    """(key path, section) of every teacher: `teacher`, or each `teachers.<name>`."""
    return list(cfg.teacher_sections.items())


def _models(cfg: "DistillationConfig") -> Iterator[tuple[str, "PolicyConfig"]]:
    """(key path, section) for the student and every teacher."""
    yield "policy", cfg.policy
    yield from _teachers(cfg)


def _training_world(cfg: "DistillationConfig") -> int | None:
    """Workers that train, or None when the generation placement is itself invalid."""
    split = worker_split(cfg.cluster, cfg.policy.generation)
    return split.training if split else None


def _backend_prefix(name: str, model: "PolicyConfig") -> str:
    """Key path of the enabled backend's section, e.g. `policy.dtensor_cfg`."""
    return f"{name}.{model.backend}_cfg"


def check_one_backend(cfg: "DistillationConfig") -> list[str]:
    """Exactly one of dtensor_cfg.enabled and megatron_cfg.enabled, for policy and for teacher."""
    problems = []
    for name, model in _models(cfg):
        enabled = (model.dtensor_cfg.enabled, model.megatron_cfg.enabled)
        if enabled.count(True) != 1:
            state = "both true" if all(enabled) else "both false"
            problems.append(
                f"{name}.dtensor_cfg.enabled and {name}.megatron_cfg.enabled are {state}; "
                "enable exactly one training backend"
            )
    return problems


def check_backend_features_available(cfg: "DistillationConfig") -> list[str]:
    """Backend features not implemented yet are off: sequence_parallel (both backends), and for
    Megatron pipeline and expert parallel and the distributed optimizer."""
    problems = []
    for name, model in _models(cfg):
        if model.dtensor_cfg.enabled == model.megatron_cfg.enabled:
            continue  # reported by check_one_backend
        prefix = _backend_prefix(name, model)
        section = getattr(model, f"{model.backend}_cfg")
        wanted = {"sequence_parallel": section.sequence_parallel}
        if model.backend == "megatron":
            wanted["pipeline_model_parallel_size"] = section.pipeline_model_parallel_size > 1
            wanted["expert_model_parallel_size"] = section.expert_model_parallel_size > 1
            wanted["distributed_optimizer"] = section.distributed_optimizer
        for key, used in wanted.items():
            if used:
                off = "false" if isinstance(getattr(section, key), bool) else "1"
                problems.append(
                    f"{prefix}.{key} is not supported yet by the {model.backend} backend; "
                    f"set it to {off}"
                )
    return problems


def check_policy_trains_teacher_frozen(cfg: "DistillationConfig") -> list[str]:
    """The policy has an optimizer and a generation section; the teacher has neither (it is
    frozen and does not sample), nor a scheduler."""
    problems = []
    for key in ("optimizer", "generation"):
        if getattr(cfg.policy, key) is None:
            problems.append(f"policy.{key} is required (the student trains and generates)")
    for path, teacher in _teachers(cfg):
        for key in ("optimizer", "scheduler", "generation"):
            if getattr(teacher, key) is not None:
                problems.append(
                    f"{path}.{key} must be null: the teacher is frozen and never samples"
                )
    return problems


def check_lora(cfg: "DistillationConfig") -> list[str]:
    """LoRA is for the student on the DTensor backend: megatron_cfg and teachers refuse it, and
    lora.dropout needs tensor_parallel_size 1."""
    problems = []
    lora = cfg.policy.lora
    if lora.enabled and lora.dropout > 0 and cfg.policy.dtensor_cfg.tensor_parallel_size > 1:
        problems.append(
            f"policy.lora.dropout ({lora.dropout}) with policy.dtensor_cfg.tensor_parallel_size "
            f"{cfg.policy.dtensor_cfg.tensor_parallel_size} is not supported yet: each "
            "tensor-parallel rank would draw its own dropout mask for the adapter factor they "
            "share; set policy.lora.dropout=0 or tensor_parallel_size=1"
        )
    if lora.enabled and cfg.policy.backend == "megatron":
        problems.append(
            "policy.lora.enabled is true with policy.megatron_cfg.enabled: LoRA students run "
            "on the DTensor backend only (megatron-core ships no adapter layers); set "
            "policy.megatron_cfg.enabled=false and policy.dtensor_cfg.enabled=true, or "
            "policy.lora.enabled=false"
        )
    for path, teacher in _teachers(cfg):
        if teacher.lora.enabled:
            problems.append(
                f"{path}.lora.enabled must be false: the teacher is frozen, and adapters are "
                "for the trained student (policy.lora)"
            )
    return problems


def check_generation_placement(cfg: "DistillationConfig") -> list[str]:
    """Non-colocated generation must leave workers for training; vLLM's tensor_parallel_size is
    1 (each generation worker runs one single-device vLLM engine)."""
    generation = cfg.policy.generation
    if generation is None:
        return []
    split = worker_split(cfg.cluster, generation)
    where = "policy.generation.colocated.resources"
    if split is None:
        resources = generation.colocated.resources
        return [
            f"{where} (gpus_per_node={resources.gpus_per_node}, num_nodes={resources.num_nodes}) "
            f"does not fit cluster (num_nodes={cfg.cluster.num_nodes}, "
            f"gpus_per_node={cfg.cluster.gpus_per_node}) with policy.generation.colocated."
            "enabled false: both must be set; on one node, generation takes fewer than all "
            "of its gpus_per_node; on several nodes, generation takes whole nodes "
            "(the same gpus_per_node) and fewer than num_nodes"
        ]
    vllm_tp = generation.vllm_cfg.tensor_parallel_size
    if vllm_tp != 1:
        return [
            f"policy.generation.vllm_cfg.tensor_parallel_size ({vllm_tp}) is not supported yet: "
            "each generation worker runs one single-device vLLM engine (data parallel over "
            "the generation workers); set it to 1"
        ]
    return []


def overlap_problem(cfg: "DistillationConfig", device: str) -> str | None:
    """Why distillation.max_staleness > 0 cannot overlap on `device` ("cuda" or "cpu"), or None:
    generation colocated with training on the same GPUs sleeps while training runs, so the two
    take turns whatever the schedule. On CPU generation and training share the cores by
    design (they run at once, each on fewer of them)."""
    generation = cfg.policy.generation
    staleness = cfg.distillation.max_staleness
    if staleness == 0 or device != "cuda" or generation is None:
        return None
    if generation.colocated.enabled:
        return (
            f"distillation.max_staleness is {staleness}, but vLLM is colocated with training "
            "(policy.generation.colocated.enabled true): its engines sleep while training "
            "holds the GPUs, so nothing can overlap; give generation GPUs of its own "
            "(colocated.enabled false and colocated.resources) or set max_staleness to 0"
        )
    return None


def check_overlap(cfg: "DistillationConfig") -> list[str]:
    """max_staleness > 0 needs generation on GPUs of its own (cluster.device cuda; "auto" is
    checked at setup, when the device is known); stream_chunks splits the step's prompts."""
    problems = []
    problem = overlap_problem(cfg, cfg.cluster.device)
    if problem:
        problems.append(problem)
    loop = cfg.distillation
    if loop.stream_chunks > loop.num_prompts_per_step:
        problems.append(
            f"distillation.stream_chunks ({loop.stream_chunks}) is more than "
            f"num_prompts_per_step ({loop.num_prompts_per_step}): each part holds whole "
            "prompts; lower it"
        )
    return problems


def check_parallel_sizes_divide_world(cfg: "DistillationConfig") -> list[str]:
    """tensor x context (x pipeline for Megatron) parallel sizes divide the training workers,
    cluster.num_nodes x cluster.gpus_per_node (less non-colocated generation workers)."""
    world = _training_world(cfg)
    if world is None:
        return []
    problems = []
    for name, model in _models(cfg):
        if model.dtensor_cfg.enabled == model.megatron_cfg.enabled:
            continue  # reported by check_one_backend
        prefix = _backend_prefix(name, model)
        sizes = f"tensor {model.tensor_parallel_size} x context {model.context_parallel_size}"
        if model.backend == "megatron":
            sizes += f" x pipeline {model.pipeline_parallel_size}"
        if world % model.model_parallel_size:
            problems.append(
                f"{prefix}: model-parallel size ({sizes} = {model.model_parallel_size}) must "
                f"divide the {world} training workers (cluster.num_nodes x cluster.gpus_per_node)"
            )
            continue
        expert = model.megatron_cfg.expert_model_parallel_size
        expert_group = model.tensor_parallel_size * model.pipeline_parallel_size * expert
        if model.backend == "megatron" and expert > 1 and world % expert_group:
            problems.append(
                f"{prefix}.expert_model_parallel_size ({expert}) x tensor x pipeline "
                f"(= {expert_group}) must divide the {world} training workers"
            )
    return problems


def check_model_parallel_within_node(cfg: "DistillationConfig") -> list[str]:
    """On several nodes, tensor x context parallel groups fit inside a node: their size divides
    cluster.gpus_per_node (ranks fill a node before the next, so data parallel spans nodes)."""
    per_node = cfg.cluster.gpus_per_node
    if cfg.cluster.num_nodes == 1:
        return []
    problems = []
    for name, model in _models(cfg):
        served = getattr(model, "server", None) is not None and model.server.enabled
        if served or model.dtensor_cfg.enabled == model.megatron_cfg.enabled:
            continue  # no workers of its own / reported by check_one_backend
        group = model.tensor_parallel_size * model.context_parallel_size
        if per_node % group:
            problems.append(
                f"{name}: tensor x context parallel size ({model.tensor_parallel_size} x "
                f"{model.context_parallel_size} = {group}) must divide cluster.gpus_per_node "
                f"({per_node}) on several nodes: each group's collectives run at every layer "
                "and stay inside one node"
            )
    return problems


def check_cluster_address(cfg: "DistillationConfig") -> list[str]:
    """cluster.address, when set, is a Ray head's GCS address host:port (or "auto"), not a
    dashboard (http://) or Ray Client (ray://) address."""
    address = cfg.cluster.address
    if address is None or address == "auto":
        return []
    problem = address_problem(address)
    return [f"cluster.address: {problem}"] if problem else []


def check_global_batch_divisible(cfg: "DistillationConfig") -> list[str]:
    """policy.train_global_batch_size is a multiple of train_micro_batch_size x the
    data-parallel size (training workers / model-parallel size)."""
    world = _training_world(cfg)
    policy = cfg.policy
    if world is None or policy.dtensor_cfg.enabled == policy.megatron_cfg.enabled:
        return []
    if world % policy.model_parallel_size:
        return []  # reported by check_parallel_sizes_divide_world
    data_parallel = world // policy.model_parallel_size
    step = policy.train_micro_batch_size * data_parallel
    if policy.train_global_batch_size % step:
        return [
            f"policy.train_global_batch_size ({policy.train_global_batch_size}) must be a "
            f"multiple of policy.train_micro_batch_size x data-parallel size "
            f"({policy.train_micro_batch_size} x {data_parallel} = {step})"
        ]
    return []


def check_rollouts_fill_global_batches(cfg: "DistillationConfig") -> list[str]:
    """distillation.num_prompts_per_step x num_generations_per_prompt is a multiple of
    policy.train_global_batch_size.

    A step's rollouts are split into global batches of train_global_batch_size, one optimizer
    step each; a remainder would either be thrown away or make a smaller batch whose gradient
    has a different scale.
    """
    loop = cfg.distillation
    rollouts = loop.num_prompts_per_step * loop.num_generations_per_prompt
    batch = cfg.policy.train_global_batch_size
    if rollouts % batch:
        return [
            f"distillation.num_prompts_per_step x distillation.num_generations_per_prompt "
            f"({loop.num_prompts_per_step} x {loop.num_generations_per_prompt} = {rollouts}) "
            f"must be a multiple of policy.train_global_batch_size ({batch})"
        ]
    return []


def check_microbatching(cfg: "DistillationConfig") -> list[str]:
    """sequence_packing and dynamic_batching are not both enabled; when one is, its token
    budgets are set and at least max_total_sequence_length (so that any sequence fits)."""
    problems = []
    for name, model in _models(cfg):
        if model.sequence_packing.enabled and model.dynamic_batching.enabled:
            problems.append(
                f"{name}.sequence_packing.enabled and {name}.dynamic_batching.enabled are both "
                "true; enable at most one"
            )
        # The teacher never trains, so only its log-prob budget matters.
        budgets = (
            ["logprob_mb_tokens"] if name != "policy" else ["train_mb_tokens", "logprob_mb_tokens"]
        )
        for scheme in ("sequence_packing", "dynamic_batching"):
            section = getattr(model, scheme)
            if section.enabled:
                for budget in budgets:
                    problems += _token_budget_problems(
                        f"{name}.{scheme}", budget, getattr(section, budget), model
                    )
    return problems


def _token_budget_problems(
    section_key: str, budget: str, tokens: int | None, model: "PolicyConfig"
) -> list[str]:
    """Problems with one microbatch token budget of an enabled packing/batching scheme."""
    longest = model.max_total_sequence_length
    if tokens is None:
        return [f"{section_key}.{budget} must be set when {section_key}.enabled is true"]
    if tokens < longest:
        return [
            f"{section_key}.{budget} ({tokens}) must be at least max_total_sequence_length "
            f"({longest}), or the longest sequences cannot fit in a microbatch"
        ]
    return []


def check_sequence_length_divisibility(cfg: "DistillationConfig") -> list[str]:
    """make_sequence_length_divisible_by is a multiple of the tensor-parallel size where
    sequence_parallel is on (which is refused for now, so this only adds to that message). The
    context-parallel size needs no setting: the engines pad to a multiple of
    lcm(make_sequence_length_divisible_by, cp)."""
    problems = []
    for name, model in _models(cfg):
        if model.dtensor_cfg.enabled == model.megatron_cfg.enabled:
            continue
        divisor = model.make_sequence_length_divisible_by
        prefix = _backend_prefix(name, model)
        sequence_parallel = getattr(model, f"{model.backend}_cfg").sequence_parallel
        if sequence_parallel and divisor % model.tensor_parallel_size:
            problems.append(
                f"{name}.make_sequence_length_divisible_by ({divisor}) must be a multiple "
                f"of the tensor-parallel size (sequence_parallel) of {prefix} "
                f"({model.tensor_parallel_size})"
            )
    return problems


def check_sequence_lengths(cfg: "DistillationConfig") -> list[str]:
    """Generated and prompt lengths fit in policy.max_total_sequence_length, and the teacher
    can score every rollout (its max_total_sequence_length is at least the policy's)."""
    longest = cfg.policy.max_total_sequence_length
    problems = []
    generation = cfg.policy.generation
    if generation is not None:
        if generation.max_new_tokens > longest:
            problems.append(
                f"policy.generation.max_new_tokens ({generation.max_new_tokens}) must be at most "
                f"policy.max_total_sequence_length ({longest})"
            )
        if generation.vllm_cfg.max_model_len > longest:
            problems.append(
                f"policy.generation.vllm_cfg.max_model_len ({generation.vllm_cfg.max_model_len})"
                f" must be at most policy.max_total_sequence_length ({longest})"
            )
    prompt = cfg.data.max_input_seq_length
    if prompt is not None and prompt >= longest:
        problems.append(
            f"data.max_input_seq_length ({prompt}) must be less than "
            f"policy.max_total_sequence_length ({longest}) to leave room for a response"
        )
    for path, teacher in _teachers(cfg):
        if teacher.max_total_sequence_length < longest:
            problems.append(
                f"{path}.max_total_sequence_length ({teacher.max_total_sequence_length}) must "
                f"be at least policy.max_total_sequence_length ({longest}) to score whole "
                "rollouts"
            )
    return problems


def check_objective(cfg: "DistillationConfig") -> list[str]:
    """A teacher is configured exactly when an objective term uses one; a policy-gradient
    objective has a nonzero advantage term and samples at a temperature above 0; GRPO and RLOO
    have at least 2 generations per prompt; topk_kl and sft use no policy-gradient key."""
    objective, teachers = cfg.objective, _teachers(cfg) or bool(cfg.self_teacher)
    problems = []
    if objective.uses_teacher and not teachers:
        problems.append(
            f"objective.loss is {objective.loss!r} with a term that needs the teacher "
            "(loss topk_kl, objective.opd_coef > 0 or objective.topk_kl_coef > 0), but teacher "
            "is null; configure a teacher section"
        )
    if not objective.uses_teacher and teachers:
        section = "teachers" if cfg.teachers is not None else "teacher"
        problems.append(
            f"{section} is configured but no objective term uses it (objective.loss "
            f"{objective.loss!r}, opd_coef {objective.opd_coef}, topk_kl_coef "
            f"{objective.topk_kl_coef}); set {section} to null ({section}=null on the command "
            "line)"
        )
    if objective.loss != "policy_gradient":
        return problems + _policy_gradient_keys_set(objective)
    if objective.opd_coef == 0 and not objective.uses_reward:
        problems.append(
            "objective.loss is 'policy_gradient' but every advantage term is off (opd_coef 0, "
            f"reward_estimator {objective.reward_estimator!r}, reward_coef "
            f"{objective.reward_coef}); set objective.opd_coef > 0, or a reward_estimator with "
            "reward_coef > 0 (or objective.loss=topk_kl for the top-k divergence alone)"
        )
    generations = cfg.distillation.num_generations_per_prompt
    if objective.uses_reward and objective.reward_estimator in ("grpo", "rloo") and generations < 2:
        problems.append(
            f"objective.reward_estimator {objective.reward_estimator!r} compares the samples of "
            "one prompt, so distillation.num_generations_per_prompt must be at least 2 (it is "
            f"{generations})"
        )
    generation = cfg.policy.generation
    if generation is not None and generation.temperature == 0:
        problems.append(
            "objective.loss 'policy_gradient' needs sampled rollouts: "
            "policy.generation.temperature must be above 0"
        )
    return problems


def _policy_gradient_keys_set(objective) -> list[str]:
    """The advantage keys set away from off under objective.loss topk_kl (they do nothing)."""
    unused = [
        f"objective.{key} ({value!r})"
        for key, value in (
            ("opd_coef", objective.opd_coef),
            ("reward_estimator", objective.reward_estimator),
            ("topk_kl_coef", objective.topk_kl_coef),
        )
        if value not in (0.0, "none")
    ]
    if not unused:
        return []
    return [
        f"{', '.join(unused)} only apply to objective.loss 'policy_gradient', but it is "
        f"{objective.loss!r}; set objective.loss=policy_gradient or leave them at 0 / none"
    ]


def check_data_mix(cfg: "DistillationConfig") -> list[str]:
    """Off-policy steps (distillation.lmbda < 1, and every step of objective.loss sft) need
    data.response_key, or distillation.seq_kd with a teacher that can sample (in-process, top-k
    objective); sft trains on the responses only (lmbda 0) and
    policy_gradient on the student's own samples only (lmbda 1)."""
    lmbda, loss = cfg.distillation.lmbda, cfg.objective.loss
    problems = []
    if loss == "sft" and lmbda not in (None, 0.0):
        problems.append(
            f"objective.loss 'sft' trains on the dataset's responses only, but distillation.lmbda "
            f"is {lmbda} (the share of on-policy steps); leave it null or set it to 0"
        )
    if loss == "policy_gradient" and lmbda not in (None, 1.0):
        problems.append(
            f"objective.loss 'policy_gradient' learns from the student's own samples (its "
            f"importance weights and advantages need them), but distillation.lmbda is {lmbda}; "
            "leave it null or set it to 1"
        )
    off_policy = loss == "sft" or (lmbda is not None and lmbda < 1)
    if cfg.distillation.seq_kd:
        return problems + _seq_kd_problems(cfg, off_policy)
    if off_policy and cfg.data.response_key is None:
        what = "objective.loss 'sft'" if loss == "sft" else f"distillation.lmbda {lmbda}"
        problems.append(
            f"{what} trains on the dataset's responses, but data.response_key is null; set it "
            "to the column holding them (tiny_math: solution)"
        )
    return problems


PRIVILEGED_FIELDS = ("prompt", "answer", "response")
"""What teacher.prompt_template may name: the record's prompt, reference answer and reference
response (data.response_key)."""


def template_fields(template: str) -> set[str]:
    """The {field} names a format string uses (ValueError if it is not one)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def _seq_kd_problems(cfg: "DistillationConfig", off_policy: bool) -> list[str]:
    """What distillation.seq_kd needs: off-policy steps, a teacher that can sample (one the run
    starts, not a served one) and a top-k objective (colocated CUDA generation, which has no
    room for a second engine yet, is refused at setup, once the device is known)."""
    problems = []
    if not off_policy:
        problems.append(
            "distillation.seq_kd samples the off-policy steps' responses from the teacher, but "
            "every step is on-policy (distillation.lmbda is 1 or null); set distillation.lmbda "
            "below 1"
        )
    if cfg.objective.loss == "sft":
        problems.append(
            "distillation.seq_kd with objective.loss 'sft' is not supported yet; use "
            "objective.loss topk_kl (the teacher grades its own samples, as TRL's seq_kd)"
        )
    if cfg.teachers is not None:
        problems.append(
            "distillation.seq_kd with several teachers is not supported yet (which one would "
            "sample?); use one teacher for seq_kd"
        )
    elif cfg.teacher is None:
        problems.append("distillation.seq_kd samples from the teacher, but teacher is null")
    elif cfg.teacher.server.enabled:
        problems.append(
            "distillation.seq_kd cannot sample from a served teacher yet "
            "(teacher.server.enabled); run the teacher in-process for seq_kd"
        )
    return problems


def check_privileged_teacher(cfg: "DistillationConfig") -> list[str]:
    """teacher.prompt_template has only plain fields ({prompt}, {answer}, {response}; no
    conversion, format specification, attribute or item), {response} with data.response_key
    set."""
    template = cfg.teacher.prompt_template if cfg.teacher is not None else None
    if template is None:
        return []
    problem = template_problem(template, PRIVILEGED_FIELDS)
    if problem:
        return [f"teacher.prompt_template {problem}"]
    if "response" in template_fields(template) and cfg.data.response_key is None:
        return [
            "teacher.prompt_template names {response}, but data.response_key is null; set it "
            "to the column holding the reference responses"
        ]
    return []


def check_prompt_file(cfg: "DistillationConfig") -> list[str]:
    """data.prompt_file is a UTF-8 file of at most 64k characters with one "{}" for the prompt
    and only plain text besides (literal braces doubled); read when the config loads."""
    if cfg.data.prompt_file is None:
        return []
    try:
        template = read_template_file(cfg.data.prompt_file)
    except (OSError, ValueError) as error:
        return [f"data.prompt_file: {error}"]
    problem = template_problem(template, None)
    return [f"data.prompt_file: the template {problem}"] if problem else []


TOOL_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""A tool named by where it lives: "package.module:attribute"."""

TEACHER_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
"""A name of `teachers` (it becomes part of metric names, teacher/<name>/...)."""


def check_routed_teachers(cfg: "DistillationConfig") -> list[str]:
    """`teachers` (several, by name) replaces `teacher` and needs data.teacher_key; names are
    1-64 letters, digits, `_`, `.` or `-`; every data.teacher_routes value names a teacher;
    a routed teacher is not served and has no prompt_template yet."""
    data, teachers = cfg.data, cfg.teachers
    if teachers is None:
        used = [key for key in ("teacher_key", "teacher_routes") if getattr(data, key) is not None]
        return [
            f"data.{key} routes prompts to several teachers, but teachers is null; configure "
            f"teachers (a section per teacher, by name) or set data.{key} to null"
            for key in used
        ]
    problems = []
    if cfg.teacher is not None:
        problems.append(
            "teacher and teachers are both set; set teacher (one teacher) or teachers (several, "
            "routed by data.teacher_key), not both"
        )
    if not teachers:
        problems.append("teachers is empty; name at least one teacher, or set teachers to null")
    if data.teacher_key is None:
        problems.append(
            "teachers (several teachers) needs data.teacher_key: the column that names each "
            "prompt's teacher (or a key of data.teacher_routes)"
        )
    bad_names = [name for name in teachers if not TEACHER_NAME.fullmatch(name)]
    if bad_names:
        problems.append(
            f"teachers: the names {bad_names} are not 1-64 letters, digits, '_', '.' or '-' "
            "(they name the teacher's metrics); rename them"
        )
    for value, name in (data.teacher_routes or {}).items():
        if name not in teachers:
            problems.append(
                f"data.teacher_routes.{value} routes to {name!r}, which is not a teacher; "
                f"teachers has {sorted(teachers)}"
            )
    for name, teacher in teachers.items():
        if teacher.server.enabled:
            problems.append(
                f"teachers.{name}.server.enabled: a served teacher among several teachers is "
                "not supported yet; run it in-process, or use one served teacher (teacher)"
            )
        if teacher.prompt_template is not None:
            problems.append(
                f"teachers.{name}.prompt_template: privileged context with several teachers is "
                "not supported yet; use one teacher (teacher) for it"
            )
    return problems


def check_data_source(cfg: "DistillationConfig") -> list[str]:
    """Exactly one of data.dataset_name and data.train_path is set, and at most one of
    data.val_path and data.val_dataset_name."""
    data = cfg.data
    problems = []
    if (data.dataset_name is None) == (data.train_path is None):
        state = "both set" if data.dataset_name is not None else "both null"
        problems.append(f"data.dataset_name and data.train_path are {state}; set exactly one")
    if data.val_path is not None and data.val_dataset_name is not None:
        problems.append(
            "data.val_path and data.val_dataset_name are both set; set one: a local file, or a "
            "dataset (null: data.dataset_name's own validation split)"
        )
    return problems


def check_checkpointing(cfg: "DistillationConfig") -> list[str]:
    """checkpointing.keep_top_k is at least 1 when enabled; ranking by a validation/ metric
    needs validation at every save (save_period a multiple of distillation.val_period)."""
    ckpt = cfg.checkpointing
    if not ckpt.enabled:
        return []
    if ckpt.keep_top_k is not None and ckpt.keep_top_k < 1:
        return [
            f"checkpointing.keep_top_k ({ckpt.keep_top_k}) must be at least 1 when "
            "checkpointing.enabled is true (null keeps all)"
        ]
    ranked_by_validation = ckpt.metric_name is not None and ckpt.metric_name.startswith(
        "validation/"
    )
    if ckpt.keep_top_k is None or not ranked_by_validation:
        return []
    val_period = cfg.distillation.val_period
    if val_period == 0 or ckpt.save_period % val_period:
        return [
            f"checkpointing.metric_name is {ckpt.metric_name!r}, so checkpointing.save_period "
            f"({ckpt.save_period}) must be a multiple of distillation.val_period ({val_period}, "
            "0 means never) for every checkpoint to have a fresh metric; or set "
            "checkpointing.metric_name to null to keep the most recent"
        ]
    return []


VALIDATION_DIVERGENCE = ("loss", "forward_kl", "reverse_kl", "top1_agreement")
"""The validation divergence's metrics, validation/<name> (and per routed teacher
validation/teacher/<teacher>/<name>), which algorithms/distillation.py logs."""
NEMO_RL_PREFIXES = {"val:": "validation/", "train:": "train/"}
"""NeMo-RL's metric prefixes (checkpointing.metric_name: val:accuracy) and ours."""


def checkpoint_metrics(cfg: "DistillationConfig") -> list[str]:
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


def check_checkpoint_metric(cfg: "DistillationConfig") -> list[str]:
    """checkpointing.metric_name names a metric the run logs (checkpoint_metrics), or is null;
    NeMo-RL's spelling (val:accuracy) is refused with ours (validation/accuracy)."""
    name = cfg.checkpointing.metric_name
    if not cfg.checkpointing.enabled or name is None:
        return []
    known = checkpoint_metrics(cfg)
    if name in known:
        return []
    hint = suggest(name, known)
    for theirs, ours in NEMO_RL_PREFIXES.items():
        spelled = ours + name.removeprefix(theirs)
        if name.startswith(theirs) and spelled in known:
            hint = f"; NeMo-RL's {show(name)} is {show(spelled)} here"
    return [
        f"checkpointing.metric_name: {show(name)} is not a metric checkpoints are ranked by"
        f"{hint}; the metrics are {', '.join(known)}; or null to keep the most recent"
    ]


def check_wandb_installed(cfg: "DistillationConfig") -> list[str]:
    """logger.wandb_enabled needs the wandb package (the `wandb` extra), checked when the config
    loads instead of after the whole setup."""
    if not cfg.logger.wandb_enabled or importlib.util.find_spec("wandb") is not None:
        return []
    return [
        "logger.wandb_enabled is true but the wandb package is not installed: install the "
        "extra (uv sync --extra wandb, or pip install 'nemo_opd[wandb]'), or set "
        "logger.wandb_enabled=false"
    ]


def check_served_teacher(cfg: "DistillationConfig") -> list[str]:
    """A served teacher (teacher.server) scores at temperature 1 only."""
    if cfg.teacher is None or not cfg.teacher.server.enabled:
        return []
    temperature = cfg.distillation.teacher_temperature or cfg.loss_fn.temperature
    if temperature != 1.0:
        return [
            f"teacher.server.enabled needs the teacher at temperature 1 (vLLM computes prompt "
            f"log-probs from the raw logits), but distillation.teacher_temperature / "
            f"loss_fn.temperature give {temperature:g}"
        ]
    return []


def check_loss_support(cfg: "DistillationConfig") -> list[str]:
    """loss_fn.support full and student_topk need one teacher run by the run's workers (not
    served, not routed) and a divergence term: the topk_kl objective, or policy_gradient with
    topk_kl_coef > 0."""
    support = cfg.loss_fn.support
    if support == "teacher_topk":
        return []
    why = f"loss_fn.support={support} (the teacher's hidden states and LM head)"
    problems = []
    objective = cfg.objective
    if objective.loss == "sft" or (objective.loss == "policy_gradient" and not objective.uses_topk):
        problems.append(
            f"{why} chooses the ids of the divergence term, which objective.loss="
            f"{objective.loss} does not have (policy_gradient: set objective.topk_kl_coef > 0); "
            "or set loss_fn.support=teacher_topk"
        )
    if cfg.teachers is not None:
        problems.append(f"{why} needs one teacher; `teachers` names {len(cfg.teachers)}")
    elif cfg.teacher is not None and cfg.teacher.server.enabled:
        problems.append(
            f"{why} needs a teacher run by the run's own workers: a served teacher "
            "(teacher.server.enabled) returns no hidden states"
        )
    return problems


def check_tools(cfg: "DistillationConfig") -> list[str]:
    """env.tools.names: each a built-in tool or "package.module:attribute", named once; a
    tool's result is read in a later turn, so distillation.max_rollout_turns is at least 2."""
    names = cfg.env.tools.names
    if not names:
        return []
    problems = []
    for name in names:
        if name not in BUILTIN_TOOLS and not TOOL_SPEC.fullmatch(name):
            known = ", ".join(sorted(BUILTIN_TOOLS))
            problems.append(
                f"env.tools.names: {name!r} is neither a built-in tool ({known}) nor "
                "'package.module:attribute'"
            )
    if len(set(names)) < len(names):
        problems.append("env.tools.names: a tool is named twice")
    if cfg.distillation.max_rollout_turns < 2:
        problems.append(
            "env.tools.names offers tools, but distillation.max_rollout_turns is 1: the model "
            "reads a tool's result in its next turn; set it to 2 or more"
        )
    return problems


CHECKS: tuple[Callable[["DistillationConfig"], list[str]], ...] = (
    check_one_backend,
    check_backend_features_available,
    check_policy_trains_teacher_frozen,
    check_lora,
    check_generation_placement,
    check_parallel_sizes_divide_world,
    check_model_parallel_within_node,
    check_cluster_address,
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
)


def find_problems(cfg: "DistillationConfig") -> list[str]:
    """Run every check; return all problems found (empty when the config is consistent)."""
    return [problem for check in CHECKS for problem in check(cfg)]
