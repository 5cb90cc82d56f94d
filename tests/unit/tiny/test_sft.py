import random

import pytest
import torch

from nemo_opd.tiny.evaluation import extract_boxed, generate_greedy, heldout_accuracy
from nemo_opd.tiny.model import build_tiny_model
from nemo_opd.tiny.recipe import ModelRecipe, TrainRecipe
from nemo_opd.tiny.sft import (
    SFTExample,
    bucketed_batches,
    collate,
    encode_sft_examples,
    lr_factor,
    train_sft,
)
from nemo_opd.tiny.task import TinyMathConfig, build_tiny_math_splits
from nemo_opd.tiny.tokenizer import build_tiny_tokenizer

SPLITS = build_tiny_math_splits(TinyMathConfig(num_train=1000, num_validation=20, seed=5))
MODEL = ModelRecipe(
    hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=2, head_dim=32, intermediate_size=128
)


@pytest.fixture(scope="module")
def tokenizer():
    return build_tiny_tokenizer(SPLITS["train"], 512, 2, 128)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7 * 12 = 84. \\boxed{84}", "84"),
        ("\\boxed{1} then \\boxed{ 2 }", "2"),
        ("the answer is 84", None),
        ("\\boxed{}", ""),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_lr_schedule_warms_up_then_decays_to_floor():
    recipe = TrainRecipe(steps=100, lr=1.0, warmup_steps=10, min_lr_ratio=0.1)
    factors = [lr_factor(s, recipe) for s in range(101)]
    assert factors[0] == pytest.approx(0.1)
    assert factors[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(factors[9:-1], factors[10:], strict=True))
    assert factors[100] == pytest.approx(0.1)


def test_collate_masks_exactly_the_assistant_targets():
    examples = [SFTExample([5, 6, 7, 8, 9], prompt_len=3), SFTExample([5, 6, 7], prompt_len=2)]
    input_ids, target_mask = collate(examples, pad_id=0)
    assert input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    targets = [input_ids[r, 1:][target_mask[r]].tolist() for r in range(2)]
    assert targets == [[8, 9], [7]]


def test_bucketed_batches_cover_every_example_each_epoch():
    lengths = [random.Random(0).randint(5, 50) for _ in range(100)]
    batches = bucketed_batches(lengths, batch_size=8, rng=random.Random(1), bucket_batches=4)
    epoch = [next(batches) for _ in range(13)]  # 100 examples = 12 full batches + 1 of 4
    assert sorted(i for batch in epoch for i in batch) == list(range(100))


def test_sft_memorizes_and_generation_is_batch_invariant(tokenizer):
    torch.manual_seed(0)
    records = SPLITS["validation"][:4]
    examples = encode_sft_examples(records, tokenizer)
    model = build_tiny_model(MODEL, tokenizer, seed=0)
    recipe = TrainRecipe(steps=60, batch_size=4, lr=1e-2, warmup_steps=5)
    logs = []
    result = train_sft(model, examples, recipe, tokenizer.pad_token_id, logs.append, name="m")
    assert result.final_loss < 0.05
    assert any("step 60/60" in line and "eta" in line for line in logs)

    prompts = [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        for r in records
    ]
    together = generate_greedy(model, tokenizer, prompts, batch_size=4, max_new_tokens=24)
    alone = generate_greedy(model, tokenizer, prompts, batch_size=1, max_new_tokens=24)
    assert together == alone == [r["solution"] for r in records]
    assert heldout_accuracy(model, tokenizer, records, batch_size=3) == 1.0
    assert heldout_accuracy(model, tokenizer, SPLITS["validation"][4:8]) < 1.0
