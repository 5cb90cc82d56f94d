"""When a teacher reads the student's rows as they are, and when it must read the student's text
in its own tokens: the same tokenizer and template, another template, another vocabulary."""

import copy

from transformers import AutoTokenizer

from nemo_opd.algorithms.tokenizers import tokenizer_difference
from nemo_opd.tiny import resolve_pretrained
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer


def _tiny():
    return AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer"))


def test_the_same_tokenizer_and_template_need_nothing():
    assert tokenizer_difference(_tiny(), _tiny()) is None


def test_another_chat_template_is_named_where_it_differs():
    teacher = copy.deepcopy(_tiny())
    teacher.chat_template = teacher.chat_template.replace("<|im_start|>", "<|im_start|> ")
    difference = tokenizer_difference(_tiny(), teacher)
    assert difference.startswith("its chat template writes a conversation differently")
    assert "from character 12" in difference  # after the first "<|im_start|>"


def test_another_vocabulary_names_a_differing_token():
    records = build_tiny_math_splits(TinyMathConfig(num_train=300, num_validation=5, seed=9))
    other = build_tiny_tokenizer(records["train"], 300, 2, 128)
    difference = tokenizer_difference(_tiny(), other)
    assert difference.startswith("its vocabulary differs from the student's")
    assert "student id" in difference and "teacher id" in difference
