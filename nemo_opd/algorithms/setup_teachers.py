"""The run's teacher: in-process workers (one Policy per named teacher, routed by data source),
a served one (reached and checked), the student itself (teacher.source student, ema or lagged),
any of them given its own prompt (teacher.prompt_template), and a teacher with another
tokenizer or chat template reading the student's text in its own tokens (its TeacherRendering,
probed at setup)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from transformers import PreTrainedTokenizerBase

from nemo_opd.algorithms.prompts import PromptSet, offered_tools
from nemo_opd.algorithms.setup_workers import SHARE
from nemo_opd.algorithms.tokenizers import load_tokenizer, tokenizer_difference
from nemo_opd.config import DistillationConfig
from nemo_opd.config.executor import is_served
from nemo_opd.data.chat import ChatFormatter, read_text_file
from nemo_opd.errors import SetupError
from nemo_opd.policy.policy import Policy
from nemo_opd.scoring.render_pool import RenderPool
from nemo_opd.scoring.rendering import TeacherRendering
from nemo_opd.teachers.base import Teacher
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher
from nemo_opd.teachers.in_process import InProcessTeacher
from nemo_opd.teachers.privileged import PrivilegedContext, PrivilegedTeacher
from nemo_opd.teachers.routed import RoutedTeachers
from nemo_opd.teachers.self_teacher import SelfTeacher
from nemo_opd.teachers.served import ServedTeacher
from nemo_opd.teachers.served_checks import check_served_teacher
from nemo_opd.teachers.server_key import server_api_key

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


def crossed(
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
        max_length=teacher_cfg.max_total_sequence_length if is_served(cfg) else None,
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


def privileged_context(
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
    if not is_served(cfg):
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


def with_privileged_context(
    teacher: Teacher | None, context: PrivilegedContext | None, formatter: ChatFormatter
) -> Teacher | None:
    """The teacher, given its own prompt when it has one."""
    if teacher is None or context is None:
        return teacher
    return PrivilegedTeacher(teacher, context, formatter.tokenizer.pad_token_id)


def start_teachers(
    cfg: DistillationConfig,
    renderings: dict[str, TeacherRendering],
    workers: int,
    placement: PlacementGroup | None,
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
            executor=cfg.cluster.executor,
        )
        section = "teacher" if cfg.teachers is None else f"teachers.{name}"
        teacher = InProcessTeacher(policy, part)
        rendering = renderings.get(section)
        if rendering is not None:  # its workers render and map their own rows
            share = named[name].max_unrendered_share
            teacher = CrossTokenizerTeacher(teacher, rendering, policy, share, section)
        teachers[name] = teacher
    return teachers["teacher"] if cfg.teachers is None else RoutedTeachers(teachers)


def self_teacher(cfg: DistillationConfig, student: Policy) -> SelfTeacher | None:
    """The student as its own teacher (teacher.source student, ema or lagged): its workers
    score the rollouts, no teacher model is loaded; None with a teacher model of its own. Its
    weights are held once the workers are up (SelfTeacher.start)."""
    return SelfTeacher(student) if cfg.self_teacher is not None else None


def served_teacher(cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase) -> Teacher:
    """The teacher behind teacher.server, checked against the live server (SetupError); one
    whose tokenizer or chat template differs from the student's reads the student's text in
    its own tokens (the server must tokenize as teacher.tokenizer does)."""
    rendering = crossed(cfg, tokenizer, "teacher", None)
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
    pool = None
    if server.render_workers:  # rendered, scored and mapped off the driver's thread
        pool = RenderPool(rendering, teacher.split(server.render_workers))
    return CrossTokenizerTeacher(
        teacher, rendering, max_unrendered_share=cfg.teacher.max_unrendered_share, pool=pool
    )
