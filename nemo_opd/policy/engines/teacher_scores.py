"""A teacher's outputs in one forward pass: any of its top-k, its log-prob of every next token
and its final hidden states, from the same hidden states per microbatch.

The loop asks a teacher for several of these at once (OPD as RL with the top-k term: the top-k
and the sampled-token log-probs; with loss_fn.support full: the hidden states and the sampled-
token log-probs); each engine call of its own would run the model again.

    out = score_positions(engine, data, topk=64, temperature=1.0, logprobs=True, hidden=False)
    out["topk_logprobs"], out["topk_indices"], out["logprobs"]      # [B, S, k], [B, S, k], [B, S]

The top-k and the log-probs come from the LM head applied chunk by chunk to the hidden states
(policy.logits_chunk_tokens; all positions at once when null), as the chunked scoring of
get_topk_logits and get_logprobs computes them. With trained_only the head runs only on the
positions whose next token is trained (token_mask[t + 1]: the loss mask's positions, the only
ones a loss reads) and the others are 0: at a real vocabulary the head is most of a teacher's
work, and a prompt's positions would be a third of it at 64 prompt and 128 sampled tokens.
"""

import torch

from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs, vocab_parallel_topk
from nemo_opd.losses.chunked_head import chunked_scores
from nemo_opd.losses.distillation_loss import build_loss_mask
from nemo_opd.policy.engines.microbatches import scatter
from nemo_opd.policy.engines.shared_prefix import shared_prefix_microbatches


@torch.no_grad()
def score_positions(
    engine,
    data: TensorBatch,
    *,
    topk: int = 0,
    temperature: float = 1.0,
    logprobs: bool = False,
    hidden: bool = False,
    trained_only: bool = False,
) -> dict[str, torch.Tensor]:
    """What is asked, for every position of `data` (input_ids, input_lengths; token_mask with
    trained_only), by `engine` (the Engine of base.py, whose Engine.score calls this: its
    microbatches, forward and LM head).

    Returns:
        a dict with, as asked: "topk_logprobs" [B, S, k] fp32 (descending) and "topk_indices"
        [B, S, k] int32 (0 at and past a row's length); "logprobs" [B, S] fp32, position t
        scoring token t + 1 (0 where t >= input_lengths - 1); "hidden_states" [B, S, H] in the
        compute precision (0 past a row's length). With trained_only the top-k and the
        log-probs are 0 also where token t + 1 is not trained (the hidden states are all
        there: the worker drops them in transit, policy/trained_positions.py). On the CPU.
    """
    if topk > engine.vocab_size:
        raise ValueError(f"k={topk} exceeds the vocabulary size {engine.vocab_size}")
    if trained_only and "token_mask" not in data:
        raise ValueError("trained_only scores the token mask's positions: the batch has none")
    data = data.to(engine.device)
    data["targets"] = torch.roll(data["input_ids"], -1, dims=1)
    fields = ("targets",)
    if trained_only:
        data["scored"] = build_loss_mask(data["token_mask"])
        fields = ("targets", "scored")
    engine.set_train_mode(False)
    out: dict[str, torch.Tensor] = {}
    for mb, states in _hidden_states(engine, data, fields):
        parts = {"hidden_states": states} if hidden else {}
        if topk or logprobs:
            targets = engine._cp_shard(mb.fields["targets"])
            scored = engine._cp_shard(mb.fields["scored"]) != 0 if trained_only else None
            parts.update(_head_scores(engine, states, targets, topk, temperature, logprobs, scored))
        for name, value in parts.items():
            value = engine._cp_gather(value)
            if name not in out:
                shape = (*data["input_ids"].shape, *value.shape[2:])
                out[name] = torch.zeros(shape, dtype=value.dtype, device=engine.device)
            scatter(value, mb, out[name])
    return {name: _zero_past_lengths(name, value, data).cpu() for name, value in out.items()}


def _hidden_states(engine, data: TensorBatch, fields: tuple[str, ...]):
    """(microbatch, the final hidden states of its rows [b, s_local, H]) per scoring
    microbatch: each run forward, or with shared-prefix scoring (engine.scores_shared_prefixes)
    the rows of each shared-prefix microbatch, expanded from the run that holds their shared
    prefixes once (shared_prefix.py)."""
    if engine.scores_shared_prefixes:
        multiple, busiest = engine._sequence_multiple(), engine._busiest_count
        items = shared_prefix_microbatches(data, fields, engine.cfg, multiple, busiest)
        for forward, output, row in items:
            yield output, row.expand(engine._forward_hidden(forward))
        return
    for mb in engine._scoring_microbatches(data, fields):
        yield mb, engine._forward_hidden(mb)


def _head_scores(engine, states, targets, topk, temperature, logprobs, scored=None) -> dict:
    """Top-k and next-token log-probs of this rank's positions [b, s_local, ...], the LM head
    applied chunk by chunk to `states` [b, s_local, H]; with `scored` ([b, s_local] bool) only
    at its positions, 0 at the others."""
    b, s = states.shape[:2]
    flat_states = states.reshape(b * s, -1)
    flat_targets = targets.reshape(-1)
    if scored is None:
        answer = _flat_head_scores(engine, flat_states, flat_targets, topk, temperature, logprobs)
        return {name: value.reshape(b, s, *value.shape[1:]) for name, value in answer.items()}
    index = scored.reshape(-1).nonzero().squeeze(1)
    answer = _flat_head_scores(
        engine, flat_states[index], flat_targets[index], topk, temperature, logprobs
    )
    out = {}
    for name, value in answer.items():
        full = value.new_zeros((b * s, *value.shape[1:]))
        full[index] = value
        out[name] = full.reshape(b, s, *value.shape[1:])
    return out


def _flat_head_scores(engine, states, targets, topk, temperature, logprobs) -> dict:
    """Top-k ([n, k] fp32 and int32) and next-token log-probs ([n] fp32) of positions
    `states` [n, H] whose next tokens are `targets` [n]."""
    n = states.shape[0]
    device = states.device
    out = {}
    if topk:
        out["topk_logprobs"] = torch.empty(n, topk, dtype=torch.float32, device=device)
        out["topk_indices"] = torch.empty(n, topk, dtype=torch.int32, device=device)
    if logprobs:
        out["logprobs"] = torch.empty(n, dtype=torch.float32, device=device)

    def keep(logits: torch.Tensor, start: int, end: int) -> None:
        scaled = logits / temperature
        if topk:
            values, ids = vocab_parallel_topk(scaled, topk, *engine._vocab())
            out["topk_logprobs"][start:end], out["topk_indices"][start:end] = values, ids
        if logprobs:
            out["logprobs"][start:end] = vocab_parallel_logprobs(
                scaled, targets[start:end], *engine._vocab()
            )

    chunked_scores(
        states,
        engine.output_weight(),
        keep,
        chunk=engine.cfg.logits_chunk_tokens or max(n, 1),
        project=engine._project,
        finish=engine._finish,
        bias=engine.output_bias(),
    )
    return out


def _zero_past_lengths(name: str, value: torch.Tensor, data: TensorBatch) -> torch.Tensor:
    """Zero the positions without an output: past a row's length, and for the next-token
    log-probs also its last position (no next token)."""
    lengths = data["input_lengths"].unsqueeze(1) - (1 if name == "logprobs" else 0)
    positions = torch.arange(value.shape[1], device=value.device)
    real = positions < lengths
    if value.dim() > 2:
        real = real.unsqueeze(-1)
    return torch.where(real, value, torch.zeros((), dtype=value.dtype, device=value.device))
