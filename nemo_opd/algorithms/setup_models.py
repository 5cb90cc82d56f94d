"""The models of a run, before anything starts: "tiny:*" names resolved to local directories,
and the student's and every teacher's tokenizer and model config checked against each other
(vocabularies, tensor-parallel sizes, families, weights on disk, top-k); SetupError on a
mismatch."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from nemo_opd.algorithms.model_checks import (
    check_model_family,
    check_sequence_length,
    check_student_ids_fit_teacher,
    check_tensor_parallel,
    check_tokenizer_fits,
    check_vocab_sizes,
    check_weights,
    load_model_config,
)
from nemo_opd.algorithms.setup_teachers import crossed
from nemo_opd.algorithms.tokenizers import load_tokenizer, own_tokenizer_notes
from nemo_opd.config import DistillationConfig
from nemo_opd.config.executor import is_served
from nemo_opd.errors import SetupError
from nemo_opd.scoring.rendering import TeacherRendering
from nemo_opd.tiny.assets import resolve_pretrained


def resolve_model_paths(cfg: DistillationConfig) -> DistillationConfig:
    """The config with "tiny:*" model and tokenizer names replaced by local directories (not a
    served teacher's model name: it is the one the server knows, and no model is loaded
    here)."""
    update = {"policy": cfg.policy.with_names(resolve_pretrained)}
    if cfg.teacher is not None:
        update["teacher"] = cfg.teacher.with_names(resolve_pretrained, model=not is_served(cfg))
    if cfg.teachers is not None:
        update["teachers"] = {
            name: teacher.with_names(resolve_pretrained) for name, teacher in cfg.teachers.items()
        }
    return cfg.model_copy(update=update)


def check_models(
    cfg: DistillationConfig,
) -> tuple[PreTrainedTokenizerBase, dict[str, TeacherRendering]]:
    """The student's tokenizer and, by section, how each teacher whose tokenizer or chat
    template differs reads the student's text (crossed), after checking the model configs
    against each other (vocabularies, tensor-parallel sizes, top-k) and that local model
    directories hold their weights; SetupError on a mismatch."""
    tokenizer = load_tokenizer(cfg.policy.tokenizer, "policy")
    local_teachers = {} if is_served(cfg) else cfg.teacher_sections  # else: checked served
    student_config = load_model_config(cfg.policy, "policy")
    check_weights(cfg.policy, "policy")
    check_tokenizer_fits(tokenizer, student_config, "policy")
    check_sequence_length(cfg.policy, student_config, "policy")
    check_tensor_parallel(cfg.policy, student_config, "policy")
    check_model_family(cfg.policy, student_config, "policy")
    renderings = {}
    for note in own_tokenizer_notes(cfg, tokenizer):  # a tokenizer not the model's own
        print(note)
    for section, teacher in local_teachers.items():
        teacher_config = load_model_config(teacher, section)
        check_weights(teacher, section)
        rendering = crossed(cfg, tokenizer, section, teacher_config.vocab_size)
        if rendering is None:
            check_vocab_sizes(student_config, teacher_config, len(tokenizer), section)
            check_student_ids_fit_teacher(student_config, teacher_config, section)
        else:
            renderings[section] = rendering
            if teacher_config.vocab_size < len(rendering.teacher):
                raise SetupError(
                    f"{section}.tokenizer ({len(rendering.teacher)} tokens) does not fit the "
                    f"vocabulary of {section}.model_name ({teacher_config.vocab_size} ids): a "
                    "teacher needs its own model's tokenizer"
                )
        check_tensor_parallel(teacher, teacher_config, section)
        check_model_family(teacher, teacher_config, section)
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
