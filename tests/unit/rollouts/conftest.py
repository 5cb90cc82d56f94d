import pytest

from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer


@pytest.fixture(scope="session")
def chat_tokenizer():
    """The tiny digit-level tokenizer with its chat template, trained on a few records."""
    records = build_tiny_math_splits(TinyMathConfig(num_train=400, num_validation=10, seed=3))
    return build_tiny_tokenizer(records["train"], 320, 2, 128)
