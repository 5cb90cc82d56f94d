"""Real tokenizers (tests/real_tokenizers.py) for the cross-tokenizer tests: built once per
machine from the packages of the dev group, loaded once per session."""

import functools
import os

import pytest


def _real_tokenizers():
    """The builder module; the tests skip only where the packages cannot be installed (never
    in CI, where the dev group installs them)."""
    try:
        import dashscope  # noqa: F401
        import llama_models  # noqa: F401
        import mistral_common  # noqa: F401
        import sentencepiece  # noqa: F401
        import tiktoken  # noqa: F401
    except ImportError as error:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"the real vocabularies' packages are missing ({error}): uv sync --group dev")
    import real_tokenizers

    return real_tokenizers


@pytest.fixture(scope="session")
def real_tokenizer():
    """name -> the real tokenizer (qwen3, llama3, tekken, mistral_sp), loaded once."""
    module = _real_tokenizers()
    return functools.cache(module.load)


@pytest.fixture(scope="session")
def real_reference():
    """name -> the family's own tokenizer as text -> ids."""
    module = _real_tokenizers()
    return functools.cache(module.reference)


@pytest.fixture(scope="session")
def xtok_setup(real_tokenizer):
    """(student, teacher) -> (rendering, rollouts, the teacher's vocabulary size): the
    cross-tokenizer tests' conversations (tests/xtok_teachers.py) as the student's rows, and
    the teacher's rendering of them with its longest row cut 8 tokens short (a served
    teacher's context). Built once per session: no test changes them (a pool or a worker
    gets a pickled copy of the rendering)."""
    from xtok_teachers import conversations

    from nemo_opd.data.chat import ChatFormatter
    from nemo_opd.data.message_log import flatten_message_logs
    from nemo_opd.scoring.base import Rollouts
    from nemo_opd.scoring.rendering import TeacherRendering

    built = {}

    def setup(student_name: str = "qwen3", teacher_name: str = "llama3"):
        if (student_name, teacher_name) in built:
            return built[student_name, teacher_name]
        student, teacher = real_tokenizer(student_name), real_tokenizer(teacher_name)
        logs = conversations(student)
        pad = student.pad_token_id if student.pad_token_id is not None else student.eos_token_id
        rollouts = Rollouts(flatten_message_logs(logs, pad), logs, [{}] * len(logs))
        rendering = TeacherRendering(student, ChatFormatter(teacher))
        longest = int(rendering.teacher_rows(logs).batch["input_lengths"].max())
        rendering.max_length = longest - 8
        built[student_name, teacher_name] = rendering, rollouts, len(teacher)
        return built[student_name, teacher_name]

    return setup
