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
