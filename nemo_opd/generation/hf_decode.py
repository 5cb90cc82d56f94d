"""The transformers backend's decode loop: a batch of prompts continued token by token over a
causal LM's forward and its KV cache (transformers' DynamicCache).

Prompts are left-padded to one width (padding masked out, positions counted from each row's
first real token), prefilled in one forward, then decoded one token per row per forward. A row
stops on a stop token (EOS or stop_token_ids: the token kept, finish reason "stop"), on a stop
string (after the token that completed it, that token kept: "stop"), or at its own token budget
("length"); a stop wins over the budget when the same token does both, as in vLLM. Rows that
stopped are dropped from the batch (and the cache) once a quarter of it has, so a batch does not
keep paying for its finished rows.

Why not `model.generate`: it samples every row from the one global RNG (torch.multinomial), so
a row's tokens would depend on the rows beside it, and its per-row budgets and stop strings go
through stopping criteria that cannot tell "stop" from "length" per row. This loop keeps
transformers' model, cache, masks and logits warpers (hf_sampling) and owns only the loop.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import DynamicCache

from nemo_opd.generation.hf_sampling import processed_logprobs, sample
from nemo_opd.generation.interface import FinishReason

PRUNE_FRACTION = 0.25
"""Drop stopped rows from the batch once at least this fraction of it has stopped."""


@dataclass
class Row:
    """One request: its prompt, budget and random stream, and what it generated so far."""

    prompt: list[int]
    budget: int
    generator: torch.Generator | None = None
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish_reason: FinishReason | None = None


@dataclass(frozen=True)
class Stopping:
    """When a row stops: on any of token_ids, or once its generated text (special tokens
    skipped, as vLLM's detokenizer reads it) holds one of strings (needs the tokenizer)."""

    token_ids: frozenset[int]
    strings: tuple[str, ...] = ()
    tokenizer: Any = None

    def reason(self, row: Row) -> FinishReason | None:
        """Why `row` stops after its newest token, or None when it goes on."""
        if row.token_ids[-1] in self.token_ids or self._string_ends(row.token_ids):
            return "stop"
        return "length" if len(row.token_ids) >= row.budget else None

    def _string_ends(self, token_ids: list[int]) -> bool:
        """Whether the newest token completed a stop string. Only a tail of the text is
        decoded: the rows are checked after every token, so a string that did not end at the
        newest token was found before. The tail holds enough tokens for the longest string
        even where a character takes several byte-level tokens."""
        if not self.strings:
            return False
        tail = 4 * max(len(s) for s in self.strings) + 8
        text = self.tokenizer.decode(token_ids[-tail:], skip_special_tokens=True)
        return any(s in text for s in self.strings)


@torch.no_grad()
def decode(
    model: torch.nn.Module,
    rows: list[Row],
    warpers,
    stopping: Stopping,
    greedy: bool,
) -> None:
    """Continue every row of `rows` until it stops, filling its token_ids, logprobs and
    finish_reason in place. `warpers` turn next-token logits into the sampling distribution
    (hf_sampling.logits_warpers); greedy takes the argmax, else row b draws with its own
    generator."""
    device = next(model.parameters()).device
    ids, mask = _left_padded([row.prompt for row in rows], device)
    positions = (mask.cumsum(dim=-1) - 1).clamp(min=0)
    cache = DynamicCache(config=model.config)
    logits = _forward(model, ids, mask, positions, cache)
    batch = list(rows)  # the row at each batch position
    stopped = torch.zeros(len(batch), dtype=torch.bool)
    next_position = positions[:, -1:] + 1
    while True:
        logprobs = processed_logprobs(logits, warpers)
        tokens = sample(logprobs, None if greedy else [row.generator for row in batch])
        chosen = logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        _append(batch, stopped, tokens.tolist(), chosen.tolist(), stopping)
        if bool(stopped.all()):
            return
        if stopped.float().mean() >= PRUNE_FRACTION:
            keep = (~stopped).nonzero().squeeze(-1)
            batch, stopped = [batch[int(j)] for j in keep], stopped[keep]
            keep = keep.to(device)
            cache.batch_select_indices(keep)
            mask, tokens, next_position = mask[keep], tokens[keep], next_position[keep]
        mask = torch.cat([mask, mask.new_ones(len(batch), 1)], dim=-1)
        logits = _forward(model, tokens.unsqueeze(-1), mask, next_position, cache)
        next_position = next_position + 1


def _append(
    batch: list[Row],
    stopped: torch.Tensor,
    tokens: list[int],
    logprobs: list[float],
    stopping: Stopping,
) -> None:
    """Give each running row its new token and log-prob; mark the rows that stop."""
    for j, row in enumerate(batch):
        if stopped[j]:
            continue
        row.token_ids.append(tokens[j])
        row.logprobs.append(logprobs[j])
        row.finish_reason = stopping.reason(row)
        stopped[j] = row.finish_reason is not None


def _forward(
    model: torch.nn.Module,
    ids: torch.Tensor,
    mask: torch.Tensor,
    positions: torch.Tensor,
    cache: DynamicCache,
) -> torch.Tensor:
    """[B, V] logits of the next token after ids [B, T] (mask [B, past + T], positions [B, T]),
    the cache extended by T positions; V = config.vocab_size (a trainer may have padded the
    output layer with rows past it, which must never be sampled)."""
    out = model(
        input_ids=ids,
        attention_mask=mask,
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    )
    return out.logits[:, -1, : model.config.vocab_size]


def _left_padded(prompts: list[list[int]], device: torch.device) -> tuple:
    """(ids [B, W], mask [B, W]): the prompts right-aligned in W = the longest's length, the
    padding (id 0) masked out."""
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for b, prompt in enumerate(prompts):
        ids[b, width - len(prompt) :] = torch.tensor(prompt, dtype=torch.long)
        mask[b, width - len(prompt) :] = 1
    return ids.to(device), mask.to(device)


def token_batches(lengths: list[int], budgets: list[int], max_tokens: int) -> list[list[int]]:
    """Row indices grouped into batches of like prompt length whose padded size (rows x (the
    longest prompt + the largest budget)) is at most max_tokens (a row larger than that alone
    in its batch)."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    batches: list[list[int]] = []
    current: list[int] = []
    budget = 0  # the largest budget in current (its longest prompt is the newest row's)
    for i in order:
        if current and (len(current) + 1) * (lengths[i] + max(budget, budgets[i])) > max_tokens:
            batches.append(current)
            current, budget = [], 0
        current.append(i)
        budget = max(budget, budgets[i])
    if current:
        batches.append(current)
    return batches
