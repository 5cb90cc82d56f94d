"""Greedy held-out accuracy of a tiny model: exact match on the last ``\\boxed{...}`` content.

The extractor is deliberately simple (no nested braces, no numeric normalization); the math
environment has the full verifier.
"""

from __future__ import annotations

import re

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text``, stripped; None if there is none."""
    matches = BOXED.findall(text)
    return matches[-1].strip() if matches else None


def chat_prompts(records: list[dict], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    """Each record's prompt as a user turn followed by the assistant header."""
    return [
        tokenizer.apply_chat_template(
            [{"role": "user", "content": r["prompt"]}], tokenize=False, add_generation_prompt=True
        )
        for r in records
    ]


@torch.no_grad()
def generate_greedy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompts: list[str],
    batch_size: int,
    max_new_tokens: int,
) -> list[str]:
    """Greedy completions of already-templated prompts, batched with left padding."""
    completions = []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(
            prompts[start : start + batch_size],
            add_special_tokens=False,
            padding=True,
            padding_side="left",
            return_tensors="pt",
        )
        output = model.generate(
            **batch,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
        new_tokens = output[:, batch["input_ids"].shape[1] :]  # [b, <= max_new_tokens]
        completions += tokenizer.batch_decode(new_tokens, skip_special_tokens=True)
    return completions


def heldout_accuracy(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    batch_size: int = 512,
    max_new_tokens: int = 32,
) -> float:
    """Fraction of records whose greedy completion boxes exactly ``record["answer"]``."""
    model.eval()
    completions = generate_greedy(
        model, tokenizer, chat_prompts(records, tokenizer), batch_size, max_new_tokens
    )
    correct = sum(
        extract_boxed(c) == r["answer"] for c, r in zip(completions, records, strict=True)
    )
    return correct / max(1, len(records))
