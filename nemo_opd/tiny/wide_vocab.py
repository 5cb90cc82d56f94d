"""The tiny pair at a real vocabulary size: the same bodies, a 151,936-row embedding (Qwen3's).

The tiny tokenizer's ids keep their rows; every row above them (ids no text ever maps to) is
set to -alpha * u, where u is a unit direction along which the model's final hidden states all
point: a hard-margin separator through the origin, fitted on the hidden states of training
solutions and of the model's own samples (temperature 1) from training prompts. The extra
ids' logits are then -alpha * (h . u), far below the real ones, so the model's distribution
over the real ids is unchanged to fp32 noise and the extra ids carry no measurable
probability. alpha is chosen so that their total probability stays below e^-MARGIN_NATS even
at MARGIN_SHARE of the fitted margin (states not seen in the fit come closer to the origin
than the fitted ones: a quarter closer on the tiny teacher's held-out text). The embeddings
are tied, so the same rows are the input embeddings of ids that never occur.

That the extra ids stay out of reach is checked, not assumed: check_extra_mass() measures their
total probability at every position of held-out solutions and of the widened model's own
samples from held-out prompts (another seed), and widen() refuses (WideVocabError) when it is
measurable (above MAX_EXTRA_MASS anywhere), or when no direction separates the hidden states
(a model whose samples are noise, like the micro recipe's, has none).

    python -m nemo_opd.tiny.wide_vocab --out DIR [--vocab-size 151936]

writes DIR/student and DIR/teacher (save_pretrained models with the tokenizer) and
DIR/wide_vocab.json (alpha, margins and the measured extra mass of each).
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import sys
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase, Qwen3ForCausalLM

QWEN3_VOCAB_SIZE = 151_936
MARGIN_NATS = 30.0
"""log(total probability of the extra ids) <= -MARGIN_NATS at MARGIN_SHARE of the margin."""
MARGIN_SHARE = 0.125
MAX_EXTRA_MASS = 1e-9
"""Measurable: a total extra-id probability above this at any checked position."""
FIT_RECORDS = 2000
CHECK_RECORDS = 500
SAMPLES_PER_PROMPT = 2
BATCH = 64
HEAD_CHUNK = 512


class WideVocabError(RuntimeError):
    """The extra ids of a widened model carry measurable probability."""


def widen(
    source: Path,
    target: Path,
    tokenizer: PreTrainedTokenizerBase,
    fit_records: list[dict],
    check_records: list[dict],
    vocab_size: int = QWEN3_VOCAB_SIZE,
    seed: int = 0,
) -> dict:
    """Save the model at source with vocab_size rows into target; its report (see the module).

    Args:
        source: a save_pretrained tiny model (tied embeddings).
        target: where the widened model and the tokenizer go.
        fit_records, check_records: {"prompt", "solution"} records (train and held-out splits);
            the direction is fitted on the first's solutions and samples from its prompts, the
            mass checked on the second's, likewise.
        seed: of the fitting samples (the checking ones use seed + 1).
    """
    model = Qwen3ForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    n_real = model.config.vocab_size
    if not model.config.tie_word_embeddings or vocab_size <= n_real:
        raise ValueError(f"widen needs tied embeddings and vocab_size > {n_real}")
    texts = _solution_texts(fit_records, tokenizer)
    texts += _samples(model, fit_records, tokenizer, n_real, seed)
    hidden, lse = _hidden_and_lse(model, _batches(texts, tokenizer))
    direction, margin = max_margin_direction(hidden)
    if margin <= 0:
        raise WideVocabError(f"{source}: no direction separates the hidden states from 0")
    n_extra = vocab_size - n_real
    alpha = (math.log(n_extra) + MARGIN_NATS - float(lse.min())) / (margin * MARGIN_SHARE)
    alpha = max(alpha, 1.0)
    _set_extra_rows(model, vocab_size, -alpha * direction)
    report = {
        "vocab_size": vocab_size,
        "real_ids": n_real,
        "alpha": alpha,
        "fit_positions": int(hidden.shape[0]),
        "fit_min_margin": margin,
    }
    report.update(check_extra_mass(model, tokenizer, check_records, n_real, seed + 1))
    worst = max(report["heldout_max_extra_mass"], report["samples_max_extra_mass"])
    if worst > MAX_EXTRA_MASS:
        raise WideVocabError(
            f"{source}: the extra ids reach probability {worst:.3g} (> {MAX_EXTRA_MASS:g})"
        )
    model.save_pretrained(target)
    tokenizer.save_pretrained(target)
    return report


def max_margin_direction(hidden: torch.Tensor, steps: int = 200) -> tuple[torch.Tensor, float]:
    """The unit u maximizing min_i hidden_i . u (a soft minimum, its temperature lowered from
    the states' mean norm to 1e-5 of it).

    Args:
        hidden: [N, H] fp32.
    Returns:
        (u [H], min_i hidden_i . u); the margin is <= 0 when no direction separates them.
    """
    h = hidden.detach().double()
    w = h.mean(0).clone().requires_grad_()
    scale = float(h.norm(dim=1).mean())
    for temperature in (scale * 10.0**-i for i in range(6)):
        optimizer = torch.optim.LBFGS([w], max_iter=steps, line_search_fn="strong_wolfe")
        optimizer.step(partial(_soft_min_loss, h, w, optimizer, temperature))
    u = (w / w.norm()).detach()
    return u.float(), float((h @ u).min())


def check_extra_mass(
    model: Qwen3ForCausalLM,
    tokenizer: PreTrainedTokenizerBase,
    records: list[dict],
    n_real: int,
    seed: int = 0,
) -> dict:
    """The largest total probability of the extra ids over the records' solutions and over the
    model's own samples from their prompts, and how many positions each covered."""
    report = {}
    samples = _samples(model, records, tokenizer, n_real, seed)
    for name, texts in (("heldout", _solution_texts(records, tokenizer)), ("samples", samples)):
        mass = extra_mass(model, _batches(texts, tokenizer), n_real)
        report[f"{name}_positions"] = int(mass.numel())
        report[f"{name}_max_extra_mass"] = float(mass.max())
    return report


def _soft_min_loss(
    h: torch.Tensor, w: torch.Tensor, optimizer: torch.optim.Optimizer, temperature: float
) -> torch.Tensor:
    """-softmin_i (h_i . w/|w|) at this temperature, its gradient in w.grad (LBFGS's closure)."""
    optimizer.zero_grad()
    scores = h @ (w / w.norm())
    loss = temperature * torch.logsumexp(-scores / temperature, 0)
    loss.backward()
    return loss


@torch.no_grad()
def extra_mass(
    model: Qwen3ForCausalLM, batches: Iterator[tuple[torch.Tensor, torch.Tensor]], n_real: int
) -> torch.Tensor:
    """The total probability of ids >= n_real at every non-padding position, [positions] fp64
    (the LM head applied HEAD_CHUNK positions at a time)."""
    weight = model.get_output_embeddings().weight
    out = []
    for ids, mask in batches:
        for chunk in _final_hidden(model, ids, mask).split(HEAD_CHUNK):
            logprobs = torch.log_softmax((chunk @ weight.T).double(), -1)
            out.append(logprobs[:, n_real:].logsumexp(-1).exp())
    return torch.cat(out)


@torch.no_grad()
def _final_hidden(model: Qwen3ForCausalLM, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[positions, H]: the final (normed) hidden states of the non-padding positions."""
    return model.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]


def _set_extra_rows(model: Qwen3ForCausalLM, vocab_size: int, row: torch.Tensor) -> None:
    n_real = model.config.vocab_size
    model.resize_token_embeddings(vocab_size, mean_resizing=False)
    with torch.no_grad():
        model.get_input_embeddings().weight[n_real:] = row
    model.config.vocab_size = vocab_size


@torch.no_grad()
def _hidden_and_lse(
    model: Qwen3ForCausalLM, batches: Iterator[tuple[torch.Tensor, torch.Tensor]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Final hidden states [N, H] of every non-padding position, and the logsumexp of their
    real-id logits [N]."""
    weight = model.get_output_embeddings().weight
    hidden = []
    for ids, mask in batches:
        hidden.append(
            model.model(input_ids=ids, attention_mask=mask).last_hidden_state[mask.bool()]
        )
    h = torch.cat(hidden)
    lse = torch.cat([(chunk @ weight.T).logsumexp(-1) for chunk in h.split(HEAD_CHUNK)])
    return h, lse


def _solution_texts(records: list[dict], tokenizer: PreTrainedTokenizerBase) -> list[str]:
    return [
        tokenizer.apply_chat_template(
            [
                {"role": "user", "content": r["prompt"]},
                {"role": "assistant", "content": r["solution"]},
            ],
            tokenize=False,
        )
        for r in records
    ]


@torch.no_grad()
def _samples(
    model: Qwen3ForCausalLM,
    records: list[dict],
    tokenizer: PreTrainedTokenizerBase,
    n_real: int,
    seed: int,
) -> list[str]:
    """The model's own rollouts (temperature 1, SAMPLES_PER_PROMPT per prompt), as
    whole texts; an extra id sampled is an error."""
    from nemo_opd.tiny.evaluation import chat_prompts

    torch.manual_seed(seed)
    tokenizer.padding_side = "left"
    prompts = chat_prompts(records, tokenizer) * SAMPLES_PER_PROMPT
    texts = []
    for start in range(0, len(prompts), BATCH):
        enc = tokenizer(prompts[start : start + BATCH], return_tensors="pt", padding=True)
        out = model.generate(**enc, do_sample=True, temperature=1.0, top_k=0, max_new_tokens=48)
        if int(out.max()) >= n_real:
            raise WideVocabError("the widened model sampled an id beyond the tokenizer's")
        texts.extend(tokenizer.batch_decode(out, skip_special_tokens=False))
    return [t.replace(tokenizer.pad_token, "") for t in texts]


def _batches(
    texts: list[str], tokenizer: PreTrainedTokenizerBase
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    tokenizer.padding_side = "right"
    for start in range(0, len(texts), BATCH):
        enc = tokenizer(
            texts[start : start + BATCH],
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        yield enc["input_ids"], enc["attention_mask"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vocab-size", type=int, default=QWEN3_VOCAB_SIZE)
    args = parser.parse_args(argv)
    from nemo_opd.tiny.assets import default_recipe, ensure_tiny_assets

    assets = ensure_tiny_assets(default_recipe())
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    fit = read_jsonl(assets.train_file)[:FIT_RECORDS]
    check = read_jsonl(assets.validation_file)[:CHECK_RECORDS]
    staging = args.out.with_name(args.out.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    reports = {}
    for role in ("teacher", "student"):
        print(f"wide_vocab: widening the tiny {role} to {args.vocab_size:,} ids", flush=True)
        source = getattr(assets, role)
        reports[role] = widen(source, staging / role, tokenizer, fit, check, args.vocab_size)
        print(f"wide_vocab: {role}: {json.dumps(reports[role])}", flush=True)
    (staging / "wide_vocab.json").write_text(
        json.dumps({"tiny_key": assets.key, **reports}, indent=2)
    )
    shutil.rmtree(args.out, ignore_errors=True)
    staging.rename(args.out)
    print(f"wide_vocab: wrote {args.out}", file=sys.stderr)


def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSONL file."""
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


if __name__ == "__main__":
    main()
