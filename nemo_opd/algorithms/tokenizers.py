"""Loading the student's and teacher's tokenizers and checking whether they agree: where both
map ids to the same tokens and their chat templates write the same text, the teacher reads the
student's rows as they are and its top-k ids are student ids; otherwise the teacher reads the
student's text in its own tokens (nemo_opd.teachers.cross_tokenizer)."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from nemo_opd.algorithms.local_paths import is_local_model, missing_folder
from nemo_opd.algorithms.preflight import TOKENIZER_FILES
from nemo_opd.config import DistillationConfig, PolicyConfig, TokenizerConfig
from nemo_opd.errors import SetupError


def load_tokenizer(cfg: TokenizerConfig, section: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model section, with the configured chat template if any; a local
    path to no folder is refused here, without asking the hub (algorithms.local_paths)."""
    problem = missing_folder(cfg.name, f"{section}.tokenizer.name")
    if problem is not None:
        raise SetupError(problem)
    try:
        tokenizer = AutoTokenizer.from_pretrained(cfg.name)
    except Exception as error:  # noqa: BLE001 - missing files, bad name, no network
        raise SetupError(f"{section}.tokenizer.name: cannot load {cfg.name!r}: {error}") from error
    if cfg.chat_template is not None:
        template = Path(cfg.chat_template)
        is_file = len(cfg.chat_template) < 4096 and template.is_file()
        tokenizer.chat_template = template.read_text() if is_file else cfg.chat_template
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


PROBE = [
    {"role": "user", "content": "What is 2 + 2? Answer in \\boxed{}."},
    {"role": "assistant", "content": "2 + 2 = 4. \\boxed{4}"},
    {"role": "user", "content": "And 3 + 3?"},
]
"""A conversation both chat templates render, to compare the text they write."""


def tokenizer_difference(
    student: PreTrainedTokenizerBase,
    teacher: PreTrainedTokenizerBase,
    student_kwargs: dict | None = None,
    teacher_kwargs: dict | None = None,
) -> str | None:
    """None when the teacher can read the student's rows as they are (the same ids for the
    same tokens, and the same chat-template text); else what differs, in a sentence. Special
    token names alone (eos_token, pad_token, bos_token) do not matter here: the teacher scores
    the student's ids, whatever each tokenizer calls its end of sequence. The kwargs: each
    side's chat-template variables (tokenizer.chat_template_kwargs)."""
    differing = _vocabulary_differences(student, teacher, limit=1)
    if differing:
        total = max(len(student), len(teacher))
        return (
            f"its vocabulary differs from the student's ({len(teacher):,} tokens against "
            f"{len(student):,}; first difference: {differing[0]}; of {total:,} ids compared)"
        )
    rendered = [_render(student, student_kwargs), _render(teacher, teacher_kwargs)]
    if rendered[0] != rendered[1]:
        at = next(
            (i for i, pair in enumerate(zip(*rendered, strict=False)) if pair[0] != pair[1]),
            min(map(len, rendered)),
        )
        return (
            "its chat template writes a conversation differently from the student's (from "
            f"character {at}: student {rendered[0][at : at + 30]!r}, teacher "
            f"{rendered[1][at : at + 30]!r})"
        )
    return None


def _render(tokenizer: PreTrainedTokenizerBase, kwargs: dict | None) -> str:
    try:
        return tokenizer.apply_chat_template(
            PROBE, tokenize=False, add_generation_prompt=True, **(kwargs or {})
        )
    except Exception as error:  # noqa: BLE001 - a template that cannot render the probe
        return f"<cannot render: {error}>"


def check_same_vocabulary(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, limit: int = 5
) -> None:
    """Raise SetupError naming the first differing tokens unless both tokenizers map the same
    strings to the same ids and share their special tokens."""
    differences = _vocabulary_differences(student, teacher, limit)
    for name in ("eos_token", "pad_token", "bos_token"):
        if getattr(student, name) != getattr(teacher, name):
            differences.append(
                f"{name}: student {getattr(student, name)!r}, teacher {getattr(teacher, name)!r}"
            )
    if differences:
        raise SetupError(
            "the student and teacher tokenizers differ; on-policy distillation needs one shared "
            "vocabulary (the teacher's top-k ids index the student's logits). First "
            "differences:\n  " + "\n  ".join(differences)
        )


def _vocabulary_differences(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, limit: int
) -> list[str]:
    """Up to `limit` tokens whose ids differ between the two vocabularies, in id order."""
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    if student_vocab == teacher_vocab:
        return []
    differences = []
    for token in sorted(set(student_vocab) | set(teacher_vocab), key=_id_order(student_vocab)):
        ids = student_vocab.get(token), teacher_vocab.get(token)
        if ids[0] != ids[1]:
            differences.append(f"{token!r}: student id {ids[0]}, teacher id {ids[1]}")
        if len(differences) == limit:
            break
    return differences


def _id_order(vocab: dict[str, int]):
    return lambda token: (vocab.get(token, 1 << 62), token)


def own_tokenizer_notes(cfg: DistillationConfig, tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """own_tokenizer_note of the student (whose tokenizer is `tokenizer`) and of each teacher
    (that tokenizer too when its tokenizer section is the student's)."""
    notes = []
    for section, model in {"policy": cfg.policy, **cfg.teacher_sections}.items():
        shared = model.tokenizer == cfg.policy.tokenizer
        notes.append(own_tokenizer_note(model, section, tokenizer if shared else None))
    return [note for note in notes if note]


def own_tokenizer_note(
    cfg: PolicyConfig, section: str, tokenizer: PreTrainedTokenizerBase | None = None
) -> str | None:
    """A warning for the start of a run when `section`.tokenizer.name is not the model's own
    tokenizer: the model is a local folder holding a tokenizer whose vocabulary differs from
    the configured one (`tokenizer`, loaded when not given). A model reads ids as the tokenizer
    it was trained with wrote them; a recipe's tokenizer inherited with another model is the
    usual cause. None when the names agree, the folder holds no tokenizer, or the two
    vocabularies are the same."""
    model, name = cfg.model_name, cfg.tokenizer.name
    if name == model or not is_local_model(model):
        return None
    if not any((Path(model) / file).is_file() for file in TOKENIZER_FILES):
        return None
    configured = tokenizer or load_tokenizer(cfg.tokenizer, section)
    own = load_tokenizer(TokenizerConfig(name=model), f"{section}.model_name")
    first = _first_difference(configured.get_vocab(), own.get_vocab())
    if first is None:
        return None
    return (
        f"warning: {section}.tokenizer.name is {name}, not the tokenizer of "
        f"{section}.model_name ({model}), and their vocabularies differ ({len(configured):,} "
        f"tokens against {len(own):,}; first difference: {first}); the model reads ids as its "
        f"own tokenizer wrote them. Unless that is meant, set {section}.tokenizer.name to the "
        "model's folder (${..model_name})"
    )


def _first_difference(configured: dict[str, int], own: dict[str, int]) -> str | None:
    """The first token, in id order, whose id differs between the configured tokenizer's
    vocabulary and the model's own; None when they are the same."""
    if configured == own:
        return None
    for token in sorted(set(configured) | set(own), key=_id_order(configured)):
        ids = configured.get(token), own.get(token)
        if ids[0] != ids[1]:
            return f"{token!r}: id {ids[0]} in the configured one, {ids[1]} in the model's own"
    return None
