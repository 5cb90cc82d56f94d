"""A plain supervised fine-tuning loop for the tiny models (CPU, fp32, one process).

Each example is a chat-formatted problem: the user turn holds the prompt, the assistant turn the
reference solution. The loss is the mean cross-entropy over assistant tokens only (the solution
and its closing ``<|im_end|>``); prompt tokens are context, never targets.

Batches are length-bucketed and right-padded. No attention mask is passed: with causal attention
and padding only on the right, a real token never attends to a pad, so sdpa can take its fast
causal path.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import PreTrainedTokenizerBase, Qwen3ForCausalLM

from nemo_opd.tiny.recipe import TrainRecipe

SENTINEL = "\x00PROMPT\x00"


@dataclass(frozen=True)
class SFTExample:
    """Token ids of a whole conversation; targets are the ids at ``prompt_len`` and after, or,
    with ``targets``, the ids it marks (the assistant turns of a conversation with tool
    results, which are context)."""

    input_ids: list[int]
    prompt_len: int
    targets: tuple[bool, ...] | None = None


@dataclass(frozen=True)
class SFTResult:
    """What a training run reports."""

    final_loss: float
    seconds: float
    trained_tokens: int
    steps: int


def chat_prompt_affixes(tokenizer: PreTrainedTokenizerBase) -> tuple[str, str]:
    """The text around a user prompt in the chat template, up to the assistant's first token."""
    messages = [{"role": "user", "content": SENTINEL}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prefix, suffix = text.split(SENTINEL)
    return prefix, suffix


def encode_sft_examples(
    records: list[dict], tokenizer: PreTrainedTokenizerBase
) -> list[SFTExample]:
    """Tokenize records as ``chat(prompt) + solution + <|im_end|>``, in one batched call each.

    Equivalent to ``apply_chat_template`` with the assistant mask (a unit test checks it), but
    renders the template once instead of once per record.
    """
    prefix, suffix = chat_prompt_affixes(tokenizer)
    prompts = [prefix + r["prompt"] + suffix for r in records]
    conversations = [
        p + r["solution"] + tokenizer.eos_token for p, r in zip(prompts, records, strict=True)
    ]
    prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
    full_ids = tokenizer(conversations, add_special_tokens=False)["input_ids"]
    examples = []
    for prompt, full in zip(prompt_ids, full_ids, strict=True):
        if full[: len(prompt)] != prompt:
            raise ValueError("prompt tokens change when the solution is appended")
        examples.append(SFTExample(full, len(prompt)))
    return examples


def bucketed_batches(
    lengths: list[int], batch_size: int, rng: random.Random, bucket_batches: int = 32
) -> Iterator[list[int]]:
    """Endless batches of example indices of similar length.

    Each epoch is shuffled, cut into chunks of ``bucket_batches`` batches, each chunk is sorted
    by length and split into batches, and the batches of a chunk are shuffled.
    """
    while True:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        chunk_size = batch_size * bucket_batches
        for start in range(0, len(order), chunk_size):
            chunk = sorted(order[start : start + chunk_size], key=lengths.__getitem__)
            batches = [chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size)]
            rng.shuffle(batches)
            yield from batches


def collate(examples: list[SFTExample], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad a batch.

    Returns:
        input_ids: [B, T] int64.
        target_mask: [B, T-1] bool, True where position t predicts an assistant token t+1.
    """
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    target_mask = torch.zeros((len(examples), width - 1), dtype=torch.bool)
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        if example.targets is None:
            target_mask[row, example.prompt_len - 1 : n - 1] = True
        else:
            target_mask[row, : n - 1] = torch.tensor(example.targets[1:n])
    return input_ids, target_mask


def assistant_loss(
    model: Qwen3ForCausalLM, input_ids: torch.Tensor, target_mask: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over the masked positions.

    Args:
        input_ids: [B, T] right-padded token ids.
        target_mask: [B, T-1] positions whose next token is a target.
    """
    hidden = model.model(input_ids=input_ids).last_hidden_state  # [B, T, H]
    logits = model.lm_head(hidden[:, :-1][target_mask])  # [N, V], only where needed
    targets = input_ids[:, 1:][target_mask]  # [N]
    return F.cross_entropy(logits, targets)


def lr_factor(step: int, recipe: TrainRecipe) -> float:
    """Linear warmup to 1, then cosine decay to ``min_lr_ratio``."""
    if step < recipe.warmup_steps:
        return (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, recipe.steps - recipe.warmup_steps)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
    return recipe.min_lr_ratio + (1.0 - recipe.min_lr_ratio) * cosine


def build_optimizer(
    model: torch.nn.Module, recipe: TrainRecipe
) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW (fused: one kernel for all parameters, which matters for tiny models whose steps
    are dominated by per-op overhead) and its warmup-cosine schedule."""
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=recipe.lr,
        betas=recipe.adam_betas,
        weight_decay=recipe.weight_decay,
        fused=True,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, recipe))
    return optimizer, scheduler


def train_sft(
    model: Qwen3ForCausalLM,
    examples: list[SFTExample],
    recipe: TrainRecipe,
    pad_id: int,
    log: Callable[[str], None] = print,
    name: str = "model",
) -> SFTResult:
    """Train ``model`` in place for ``recipe.steps`` steps; the data order comes from
    ``recipe.seed``. Logs step, loss, learning rate, throughput and ETA about ten times."""
    optimizer, scheduler = build_optimizer(model, recipe)
    batches = bucketed_batches(
        [len(e.input_ids) for e in examples], recipe.batch_size, random.Random(recipe.seed)
    )
    log_every = max(1, recipe.steps // 10)
    model.train()
    start, tokens, recent = time.perf_counter(), 0, []
    for step in range(recipe.steps):
        input_ids, target_mask = collate([examples[i] for i in next(batches)], pad_id)
        loss = assistant_loss(model, input_ids, target_mask)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), recipe.grad_clip)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        tokens += input_ids.numel()
        recent = (recent + [loss.item()])[-20:]
        if (step + 1) % log_every == 0 or step + 1 == recipe.steps:
            elapsed = time.perf_counter() - start
            eta = elapsed / (step + 1) * (recipe.steps - step - 1)
            log(
                f"{name}: step {step + 1}/{recipe.steps}  loss {sum(recent) / len(recent):.4f}  "
                f"lr {scheduler.get_last_lr()[0]:.2e}  {tokens / elapsed:,.0f} tok/s  "
                f"elapsed {elapsed:.0f}s  eta {eta:.0f}s"
            )
    model.eval()
    seconds = time.perf_counter() - start
    return SFTResult(sum(recent) / len(recent), seconds, tokens, recipe.steps)
