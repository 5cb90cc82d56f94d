"""Loading the student's and teacher's tokenizers and checking that they agree: the teacher's
top-k indices are used as student vocabulary ids, so both must map ids to the same tokens."""

from pathlib import Path

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from nemo_opd.config import TokenizerConfig
from nemo_opd.errors import SetupError


def load_tokenizer(cfg: TokenizerConfig, section: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a model section, with the configured chat template if any."""
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


def check_same_vocabulary(
    student: PreTrainedTokenizerBase, teacher: PreTrainedTokenizerBase, limit: int = 5
) -> None:
    """Raise SetupError naming the first differing tokens unless both tokenizers map the same
    strings to the same ids and share their special tokens."""
    student_vocab, teacher_vocab = student.get_vocab(), teacher.get_vocab()
    differences = []
    for token in sorted(set(student_vocab) | set(teacher_vocab), key=_id_order(student_vocab)):
        ids = student_vocab.get(token), teacher_vocab.get(token)
        if ids[0] != ids[1]:
            differences.append(f"{token!r}: student id {ids[0]}, teacher id {ids[1]}")
        if len(differences) == limit:
            break
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


def _id_order(vocab: dict[str, int]):
    return lambda token: (vocab.get(token, 1 << 62), token)
