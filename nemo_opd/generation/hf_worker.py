"""HfWorker: a generation engine on transformers' own model, cache and logits warpers, where
vLLM is not installed (the transformers generation backend, policy.generation.backend).

It answers the calls VllmWorker answers, with the same semantics, so VllmGeneration drives
either one (splitting prompts over engines, per-prompt seeds and budgets, refit):
- generate: one continuation per prompt with its own budget and seed; log-probs of each sampled
  token from the distribution it was sampled from (hf_sampling: vLLM's processed log-probs);
  greedy at temperature 1. A prompt's tokens do not depend on the batch it is in (one random
  stream per row). Stopping as in vLLM (hf_decode): EOS and stop_token_ids kept, finish reason
  "stop"; stop strings after the token that completed them; "length" at the budget.
- score: prompt log-probs at temperature 1.
- update_weights: the full state dict in Hugging Face names copied into the model in place.
- sleep / wake_up: colocated on CUDA, the weights move to host memory and back (the KV cache
  lives only inside a generate call).

Where the worker shares the process with the trainer, it can serve from the trainer's own
module instead of a copy (share_module; started without a model_path it loads none and waits
for one): refit then copies nothing. See share_module for when that is safe.

The model is loaded with AutoModelForCausalLM in transformers_cfg.precision, on the one CUDA
device the process sees, else on the CPU (its threads: the process's OMP_NUM_THREADS).
"""

import os
import time
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_opd.generation.hf_decode import Row, Stopping, decode, token_batches
from nemo_opd.generation.hf_sampling import is_greedy, logits_warpers, row_generators
from nemo_opd.generation.interface import GenerationOutput
from nemo_opd.generation.shared_module import serving
from nemo_opd.utils.startup import StartupMarks

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HfWorker:
    """One transformers model on one device, answering VllmWorker's calls.

    Args:
        model_path: Hugging Face checkpoint directory (or hub name) of the model; None loads
            none: the engine serves only once share_module has given it the trainer's.
        tokenizer_path: tokenizer to load; None skips it (token ids in and out only: no EOS from
            the tokenizer, no stop strings).
        engine_cfg: TransformersConfig.model_dump(): precision (the weights' dtype) and
            max_batch_tokens (rows x (longest prompt + largest budget) decoded at once).
        seed: the RNG seed of requests that carry no seed of their own.
        sleep_mode: colocated on CUDA, sleep() moves the weights to host memory; ignored on CPU.
        module: serve from this module instead of loading model_path (share_module).
    """

    def __init__(
        self,
        model_path: str | None,
        tokenizer_path: str | None,
        engine_cfg: dict[str, Any],
        seed: int = 0,
        sleep_mode: bool = False,
        module: torch.nn.Module | None = None,
    ) -> None:
        self.startup = StartupMarks()
        started = time.perf_counter()
        self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(self.device_type)
        self.max_batch_tokens = engine_cfg["max_batch_tokens"]
        self.sleep_mode = sleep_mode and self.device_type == "cuda"
        self.rng = torch.Generator().manual_seed(seed)
        self.tokenizer = (
            None if tokenizer_path is None else AutoTokenizer.from_pretrained(tokenizer_path)
        )
        self.shared = False
        self.model: torch.nn.Module | None = None
        if module is not None:
            self.share_module(module)
        elif model_path is not None:
            dtype = DTYPES[engine_cfg["precision"]]
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype)
            self.model = model.to(self.device).eval().requires_grad_(False)
        self.start_time_s = time.perf_counter() - started
        self.startup.note("engine_ready")
        self.asleep = False

    def share_module(self, module: torch.nn.Module) -> None:
        """Generate from `module` (the trainer's own transformers causal LM, in this process)
        instead of a copy: what it holds is what generate samples from, so a refit copies
        nothing (update_weights refuses; the caller only records the new version).

        Safe only in lockstep: the module must not be training (nor its optimizer stepping)
        while a generate or score call runs, since those read its parameters as they are. Each
        call switches it to eval mode and to sdpa attention, with an FSDP2 module's parameters
        gathered for the call, and puts all of it back afterwards (shared_module.serving); it
        runs on the module's own device and in its compute precision (transformers_cfg's is
        not applied). Sleep and wake-up leave it alone (the trainer owns its memory). Logits
        past config.vocab_size (rows a trainer padded the vocabulary with) are never sampled.
        """
        self.model = module
        self.shared = True
        self.device = next(module.parameters()).device

    def startup_marks(self) -> dict[str, float]:
        """This engine's start-up times (nemo_opd.utils.startup)."""
        return self.startup.as_dict()

    def stop(self) -> None:
        """Let go of the model (a shared module stays its trainer's); nothing else to end."""
        self.model = None

    def ready(self) -> float:
        """Seconds the engine took to start (also a liveness check)."""
        return self.start_time_s

    def generate(
        self,
        prompts: list[list[int]],
        max_new_tokens: list[int],
        sampling: dict[str, Any],
        seeds: list[int] | None = None,
    ) -> GenerationOutput:
        """Sample one continuation per prompt (VllmWorker.generate's contract).

        Args:
            prompts: token ids of each prompt (B lists).
            max_new_tokens: per-prompt token budget (B ints, each >= 1).
            sampling: temperature (0 = greedy), top_p, top_k (None = off), stop_token_ids,
                stop_strings (need a tokenizer).
            seeds: per-prompt sampling seed (B ints), or None for seeds drawn from the
                engine's RNG.

        Returns:
            GenerationOutput with B entries; logprobs as described in hf_sampling.
        """
        if len(max_new_tokens) != len(prompts) or min(max_new_tokens, default=1) < 1:
            raise ValueError(
                f"need one budget >= 1 per prompt ({len(prompts)}), got {max_new_tokens}"
            )
        if seeds is None:
            seeds = torch.randint(0, 2**63 - 1, (len(prompts),), generator=self.rng).tolist()
        greedy = is_greedy(sampling)
        generators = None if greedy else row_generators(seeds, self.device)
        rows = [
            Row(list(p), budget, None if generators is None else generators[i])
            for i, (p, budget) in enumerate(zip(prompts, max_new_tokens, strict=True))
        ]
        stopping = self._stopping(sampling)
        warpers = logits_warpers(sampling)
        started = time.perf_counter()
        with self._serving() as model:
            for batch in token_batches(
                [len(p) for p in prompts], max_new_tokens, self.max_batch_tokens
            ):
                decode(model, [rows[i] for i in batch], warpers, stopping, greedy)
        elapsed = time.perf_counter() - started
        result = GenerationOutput(
            token_ids=[row.token_ids for row in rows],
            logprobs=[row.logprobs for row in rows],
            finish_reasons=[row.finish_reason for row in rows],
        )
        generated = sum(len(row.token_ids) for row in rows)
        result.metrics = {"generate_time_s": elapsed, "generated_tokens": float(generated)}
        return result

    @torch.no_grad()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t) for t = 1..n-1 of each full sequence (temperature 1).

        Returns B lists of len(sequence) - 1 floats, aligned like Policy.get_logprobs row b,
        positions 0..n-2.
        """
        lengths = [len(s) for s in sequences]
        scores: list[list[float]] = [[] for _ in sequences]
        with self._serving() as model:
            for batch in token_batches(lengths, [0] * len(sequences), self.max_batch_tokens):
                width = max(lengths[i] for i in batch)
                ids = torch.zeros(len(batch), width, dtype=torch.long)
                mask = torch.zeros(len(batch), width, dtype=torch.long)
                for b, i in enumerate(batch):
                    ids[b, : lengths[i]] = torch.tensor(sequences[i])
                    mask[b, : lengths[i]] = 1
                logits = model(
                    input_ids=ids.to(self.device), attention_mask=mask.to(self.device)
                ).logits
                for b, i in enumerate(batch):
                    n = lengths[i]
                    row = logits[b, : n - 1, : model.config.vocab_size].float().log_softmax(-1)
                    scores[i] = (
                        row.gather(-1, ids[b, 1:n, None].to(self.device)).squeeze(-1).tolist()
                    )
        return scores

    def update_weights(self, weights: dict[str, torch.Tensor]) -> float:
        """Copy full HF-named tensors into the model in place; returns seconds taken.

        `weights` must name exactly the model's tensors (lm_head.weight included even when the
        embeddings are tied: both names then fill the one shared tensor); a name missing or
        unknown is a ValueError, and nothing is copied.
        """
        if self.shared:
            raise RuntimeError(
                "this generation engine reads the trainer's own module (share_module): its "
                "weights are already the trainer's, so a refit must not copy any"
            )
        started = time.perf_counter()
        expected = set(self.model.state_dict())
        missing, unknown = sorted(expected - set(weights)), sorted(set(weights) - expected)
        if missing or unknown:
            raise ValueError(
                f"update_weights: {len(missing)} of the model's tensors missing "
                f"({', '.join(missing[:3])}) and {len(unknown)} unknown "
                f"({', '.join(unknown[:3])}); send the full state dict in Hugging Face names, "
                "lm_head.weight included"
            )
        with torch.no_grad():
            self.model.load_state_dict(weights, strict=True)
        return time.perf_counter() - started

    def sleep(self, level: int = 1) -> None:
        """Release device memory: with sleep_mode, the weights move to host memory (level is
        accepted for VllmWorker's signature; the KV cache never outlives a call). A no-op on
        CPU, without sleep_mode, and for a shared module."""
        if self.sleep_mode and not self.shared and not self.asleep:
            self.model.to("cpu")
            torch.cuda.empty_cache()
            self.asleep = True

    def wake_up(self) -> None:
        """Undo sleep(); a no-op when awake."""
        if self.asleep:
            self.model.to(self.device)
            self.asleep = False

    def ping(self) -> int:
        """The process id (liveness checks, tests)."""
        return os.getpid()

    def _stopping(self, sampling: dict[str, Any]) -> Stopping:
        """The stop rule of one call: EOS (the tokenizer's and the model's generation config's,
        as vLLM reads them), stop_token_ids and stop_strings."""
        strings = tuple(sampling.get("stop_strings") or ())
        if strings and self.tokenizer is None:
            raise ValueError("stop_strings need a tokenizer (this engine was started without one)")
        stops = set(sampling.get("stop_token_ids") or ())
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            stops.add(self.tokenizer.eos_token_id)
        self._check_model()
        eos = self.model.generation_config.eos_token_id if self.model.generation_config else None
        stops.update([eos] if isinstance(eos, int) else eos or [])
        return Stopping(frozenset(stops), strings, self.tokenizer)

    @contextmanager
    def _serving(self):
        """The model ready to generate: awake; a shared module made ready and put back
        afterwards (shared_module.serving)."""
        if self.asleep:
            raise RuntimeError("the generation engine is asleep: call wake_up() first")
        self._check_model()
        if not self.shared:
            yield self.model
            return
        with serving(self.model) as model:
            yield model

    def _check_model(self) -> None:
        """RuntimeError when the engine has no model yet (started for a shared module)."""
        if self.model is None:
            raise RuntimeError(
                "this generation engine was started without a model, to serve the trainer's "
                "own module, and has not been given it (share_module)"
            )
