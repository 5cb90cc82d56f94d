"""VllmWorker: one in-process vLLM engine (one data-parallel replica), as a Ray actor or as an
object in the driver's process (the local executor).

The engine runs inside the actor's own process: vLLM's V1 engine core in-process
(VLLM_ENABLE_V1_MULTIPROCESSING=0) with the single-process executor (backend "uni"). Building
the engine then skips starting and connecting an engine-core process (several times faster on
CPU; docs/generation.md has the figures), and update_weights hands tensors to the model runner
by reference: nothing is pickled, so no callable has to be serialized and
VLLM_ALLOW_INSECURE_SERIALIZATION stays unset. The price is tensor_parallel_size == 1 per
engine (a tp > 1 engine needs vLLM's multiprocess executor, where an iterator of tensors cannot
cross the process boundary); scale out with more engines instead.

vLLM changes its process: on CPU its worker replaces torch.set_num_threads with a function that
refuses (a guard for the thread binding of its multiprocess executor, which the single-process
executor does not do), it seeds the global RNGs, and with enforce_eager this worker turns
TorchDynamo off (in the threads that call it). In an actor of its own that touches nothing
else; in the driver's process (the local executor) the engine computes on the process's torch
threads, set by the run before the engine starts, and torch.set_num_threads is put back once
the engine is built (or has failed to start), so that the training engines started after it set
theirs (the same count).

Which distribution the returned log-probs come from: the engine is built with
logprobs_mode="processed_logprobs", so each sampled token's log-prob is taken from the
distribution it was actually sampled from, i.e. log_softmax(logits / temperature) after top-k /
top-p filtering (the kept tokens renormalized). With top_k = null and top_p = 1 this equals the
student's own log_softmax(logits / T), which is what the rollout compares against. vLLM's default
("raw_logprobs") would report log_softmax(logits) before temperature instead. Greedy decoding
applies no temperature: its log-probs are log_softmax(logits) (temperature 1). score() uses
prompt log-probs, which vLLM never passes through the sampler: they are at temperature 1 too.
On CUDA the processed mode makes vLLM use its PyTorch sampler instead of FlashInfer's.

Stopping: EOS (from the tokenizer, so only when one is loaded) and stop_token_ids end a row with
that token included in token_ids; a stop string ends it after the token that completed the
string (that token included, its text may run past the string). Text is only detokenized when
stop strings are set.

On CPU, vLLM 0.32's attention kernels reject head_dim 16 at the first forward (32 works).
"""

import gc
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from nemo_opd.generation.interface import FinishReason, GenerationOutput
from nemo_opd.utils.gc_pause import collections_deferred
from nemo_opd.utils.startup import StartupMarks

# Set in the engine's process before vLLM reads them (VllmGeneration also passes them as a Ray
# actor's runtime_env, which gives the actor a fresh process that has them from the start).
ENGINE_ENV = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process (see module docstring)
}


def set_engine_env() -> None:
    """Apply ENGINE_ENV. vLLM reads its environment when asked until its first engine in the
    process keeps what it read (its envs cache); vLLM imported before is fine (unpickling one
    of its exceptions imports it), an engine built before with other values is not
    (RuntimeError)."""
    for key, value in ENGINE_ENV.items():
        os.environ[key] = value
    envs = sys.modules.get("vllm.envs")
    if envs is not None and envs.VLLM_ENABLE_V1_MULTIPROCESSING:
        raise RuntimeError(
            "a vLLM engine built earlier in this process runs its engine core in a process of "
            "its own (VLLM_ENABLE_V1_MULTIPROCESSING unset), and vLLM keeps what it read then; "
            "run the generation engines on Ray (cluster.executor=ray), or build them before "
            "any other vLLM engine of the process"
        )


class _RotaryReloadFilter(logging.Filter):
    """Drops vLLM's "RotaryEmbedding: Failed to load weights" warning, logged at every in-place
    reload: rotary embeddings hold a computed cos/sin cache, never a checkpoint weight, and vLLM
    keeps that cache (it puts the layer's own tensors back)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rotary = record.args and str(record.args[0]).endswith("RotaryEmbedding")
        return not (rotary and "Failed to load weights" in str(record.msg))


class _ThreadCountFilter(logging.Filter):
    """Drops vLLM's "CPU backend doesn't allow to use `torch.set_num_threads`" warning, logged
    each time its start-up asks for a thread count while its guard is in place (see the module
    docstring): the engine keeps the count its process has."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "torch.set_num_threads" not in str(record.msg)


def quiet_vllm_logs() -> None:
    """vLLM logs several INFO lines per refit and per generate call; keep its warnings and
    errors only, unless the user chose a level with VLLM_LOGGING_LEVEL, on standard error
    (utils/worker_output.py).

    Through VLLM_LOGGING_LEVEL itself: vLLM re-applies its logging config (level included)
    when an engine is built, which undoes a level set on its logger beforehand."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # not its stdout
    reload_logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    reload_logger.addFilter(_RotaryReloadFilter())
    logging.getLogger("vllm.v1.worker.cpu_worker").addFilter(_ThreadCountFilter())


# vLLM's default per-step token budget on CPU (its scheduler's DEFAULT_MAX_NUM_BATCHED_TOKENS).
CPU_STEP_TOKENS = 4096


def cpu_scheduler_args(device_type: str, max_model_len: int) -> dict[str, Any]:
    """LLM() arguments that keep seeded sampling working on CPU.

    With chunked prefill, a prompt that does not fit the step's token budget is prefilled in
    pieces and the token sampled after a partial piece is discarded; vLLM then rewinds that
    request's seeded generator with ``Generator.set_offset``, which CPU generators do not
    support ("CPU Generator does not use offset"). That happens as soon as one generate() call
    holds more prompt tokens than the budget (e.g. a few hundred prompts). Without chunked
    prefill a prompt is always prefilled whole, so nothing is discarded; the budget must then
    hold the longest sequence.
    """
    if device_type != "cpu":
        return {}
    return {
        "enable_chunked_prefill": False,
        "max_num_batched_tokens": max(CPU_STEP_TOKENS, max_model_len),
    }


def vllm_tokenizer_source(tokenizer_path: str | None, model_path: str) -> str:
    """What to hand vLLM as `tokenizer`: the model directory when the tokenizer is a local
    directory without a model config.json and the model directory holds the same tokenizer
    (every file of the tokenizer directory, equal; in tokenizer.json the padding and truncation
    settings may differ): the project's tiny assets. vLLM reads a model config from the
    tokenizer source and, without one, logs two errors and waits 2 s before retrying; the
    tokenizer it loads is the same either way."""
    if tokenizer_path is None:
        return model_path
    tokenizer_dir, model_dir = Path(tokenizer_path), Path(model_path)
    if not tokenizer_dir.is_dir() or (tokenizer_dir / "config.json").exists():
        return tokenizer_path
    files = [path for path in tokenizer_dir.iterdir() if path.is_file()]
    same = bool(files) and all(_same_tokenizer_file(path, model_dir / path.name) for path in files)
    return model_path if same else tokenizer_path


def _same_tokenizer_file(path: Path, other: Path) -> bool:
    if not other.is_file():
        return False
    if path.name != "tokenizer.json":
        return path.read_bytes() == other.read_bytes()
    runtime = ("padding", "truncation")  # call-time settings, not the vocabulary

    def content(file: Path) -> dict:
        return {k: v for k, v in json.loads(file.read_text()).items() if k not in runtime}

    return content(path) == content(other)


class VllmWorker:
    """One vLLM engine on one device (a GPU, or this process's CPU threads).

    Args:
        model_path: Hugging Face checkpoint directory (or hub name) of the student.
        tokenizer_path: tokenizer to load; None skips it (token ids in and out only: no EOS from
            the tokenizer, no stop strings).
        vllm_cfg: VllmConfig.model_dump(): precision, max_model_len, gpu_memory_utilization
            (on CPU: the fraction of the memory node's RAM vLLM reserves for weights plus KV
            cache), kv_cache_memory_bytes (a fixed KV cache instead), enforce_eager,
            tensor_parallel_size (must be 1, see module docstring).
        seed: the engine's RNG seed (used by requests that carry no seed of their own).
        sleep_mode: enable vLLM's sleep mode (colocated on CUDA); ignored on CPU.
    """

    def __init__(
        self,
        model_path: str,
        tokenizer_path: str | None,
        vllm_cfg: dict[str, Any],
        seed: int = 0,
        sleep_mode: bool = False,
    ) -> None:
        self.startup = StartupMarks()
        if vllm_cfg.get("tensor_parallel_size", 1) != 1:
            raise ValueError(
                "generation.vllm_cfg.tensor_parallel_size must be 1: each VllmWorker runs vLLM "
                "in-process (weights are refit by reference); use more engines instead"
            )
        set_engine_env()
        quiet_vllm_logs()
        from vllm import LLM  # after set_engine_env and quiet_vllm_logs, on purpose

        self.startup.note("vllm_imported")
        # vLLM's engine start runs full collections (gc.collect) several times, then freezes
        # what it built; freezing what exists now (the modules just imported) first spares those
        # collections from walking every object of the process again (utils/gc_pause.py).
        gc.freeze()

        self.device_type = "cuda" if torch.cuda.is_available() else "cpu"
        # Eager means eager: vLLM still compiles (inductor) the helper that ranks sampled
        # tokens for their log-probs, at the first generate that asks for log-probs: seconds of
        # a 2-core CPU, for an integer count that is the same either way.
        self.no_dynamo = self.device_type == "cpu" and vllm_cfg["enforce_eager"]
        self._eager_here()
        started = time.perf_counter()
        set_num_threads = torch.set_num_threads  # vLLM's CPU worker replaces it (see above)
        try:
            self.llm = LLM(
                **cpu_scheduler_args(self.device_type, vllm_cfg["max_model_len"]),
                model=model_path,
                tokenizer=vllm_tokenizer_source(tokenizer_path, model_path),
                skip_tokenizer_init=tokenizer_path is None,
                dtype=vllm_cfg["precision"],
                max_model_len=vllm_cfg["max_model_len"],
                gpu_memory_utilization=vllm_cfg["gpu_memory_utilization"],
                kv_cache_memory_bytes=vllm_cfg["kv_cache_memory_bytes"],
                enforce_eager=vllm_cfg["enforce_eager"],
                tensor_parallel_size=1,
                distributed_executor_backend="uni",
                seed=seed,
                logprobs_mode="processed_logprobs",
                enable_sleep_mode=sleep_mode and self.device_type == "cuda",
            )
        finally:  # a start that fails leaves the process as it found it too
            torch.set_num_threads = set_num_threads
        self.start_time_s = time.perf_counter() - started
        self.startup.note("engine_ready")
        self.asleep = False

    def _eager_here(self) -> None:
        """TorchDynamo off in the calling thread where the engine is eager on CPU (no_dynamo).
        Its settings are per thread (a ContextVar): in the driver's process the loop's threads
        each call the engine, so every call turns it off in its own."""
        if self.no_dynamo:
            torch._dynamo.config.disable = True

    def startup_marks(self) -> dict[str, float]:
        """This engine's start-up times (nemo_opd.utils.startup)."""
        return self.startup.as_dict()

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
        """Sample one continuation per prompt.

        Args:
            prompts: token ids of each prompt (B lists).
            max_new_tokens: per-prompt token budget (B ints, each >= 1).
            sampling: temperature (0 = greedy), top_p, top_k (None = off), stop_token_ids,
                stop_strings (need a tokenizer).
            seeds: per-prompt sampling seed (B ints), or None for the engine's RNG.

        Returns:
            GenerationOutput with B entries; logprobs as described in the module docstring.
        """
        from vllm import SamplingParams

        self._eager_here()
        params = [
            SamplingParams(
                n=1,
                temperature=sampling["temperature"],
                top_p=sampling.get("top_p", 1.0),
                top_k=sampling.get("top_k") or 0,  # 0 disables top-k in vLLM
                max_tokens=budget,
                stop=sampling.get("stop_strings") or None,
                stop_token_ids=sampling.get("stop_token_ids") or None,
                seed=None if seeds is None else seeds[i],
                logprobs=0,  # the sampled token's own log-prob only
                detokenize=bool(sampling.get("stop_strings")),  # text only to find stop strings
            )
            for i, budget in enumerate(max_new_tokens)
        ]
        requests = [{"prompt_token_ids": list(p)} for p in prompts]
        started = time.perf_counter()
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        elapsed = time.perf_counter() - started
        result = GenerationOutput(token_ids=[], logprobs=[], finish_reasons=[])
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            result.token_ids.append(ids)
            result.logprobs.append(_sampled_logprobs(completion.logprobs, ids))
            result.finish_reasons.append(_finish_reason(completion.finish_reason))
        generated = sum(len(ids) for ids in result.token_ids)
        result.metrics = {"generate_time_s": elapsed, "generated_tokens": float(generated)}
        return result

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t) for t = 1..n-1 of each full sequence (temperature 1).

        Returns B lists of len(sequence) - 1 floats, aligned like Policy.get_logprobs row b,
        positions 0..n-2.
        """
        from vllm import SamplingParams

        self._eager_here()
        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        requests = [{"prompt_token_ids": list(s)} for s in sequences]
        outputs = self.llm.generate(requests, params, use_tqdm=False)
        # entry 0 of prompt_logprobs is None (nothing predicts the first token)
        return [
            _sampled_logprobs(out.prompt_logprobs[1:], list(out.prompt_token_ids[1:]))
            for out in outputs
        ]

    def update_weights(self, weights: dict[str, torch.Tensor]) -> float:
        """Copy full HF-named tensors into the running model in place; returns seconds taken.

        `weights` must hold every parameter, lm_head.weight included even when the embeddings
        are tied (reloading from a directory leaves a tied fp32 lm_head stale). The prefix cache
        is reset afterwards: cached KV blocks were computed by the old weights.
        """
        started = time.perf_counter()
        # In-process executor: the iterator reaches the model runner by reference.
        self.llm.collective_rpc(
            "reload_weights", kwargs={"weights_iterator": iter(weights.items())}
        )
        self.llm.reset_prefix_cache()
        return time.perf_counter() - started

    def sleep(self, level: int = 1) -> None:
        """Release device memory (CUDA sleep mode: level 1 keeps weights in host memory, drops
        the KV cache); a no-op on CPU, where vLLM has no sleep mode."""
        if self.device_type == "cuda" and not self.asleep:
            self.llm.sleep(level=level)
            self.asleep = True

    def wake_up(self) -> None:
        """Undo sleep(); a no-op when awake or on CPU."""
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def stop(self) -> None:
        """Shut the engine down now (idempotent). vLLM's teardown frees its memory, unfreezes
        and collects the process's objects and destroys its torch.distributed group, the one
        the process's other engines share (process_group.init_local_process_group); stopped
        by the run after them, it ends nothing still in use. Dropped without this, vLLM tears
        down at whatever collection first finds the engine: in the middle of another
        engine's work. Its two full collections are one (utils/gc_pause.py)."""
        with collections_deferred():
            self.llm.llm_engine.engine_core.shutdown()

    def ping(self) -> int:
        """The actor's process id (liveness checks, tests)."""
        return os.getpid()


def _sampled_logprobs(per_position: list[dict] | None, token_ids: list[int]) -> list[float]:
    """The log-prob of token_ids[t] from per_position[t] ({token_id: Logprob}); len(token_ids)."""
    if per_position is None:
        raise RuntimeError("vLLM returned no log-probs; the request must ask for them")
    return [float(entry[tok].logprob) for entry, tok in zip(per_position, token_ids, strict=True)]


def _finish_reason(reason: str | None) -> FinishReason:
    """vLLM's "length" stays; "stop" (EOS, stop token, stop string) and anything else -> stop."""
    return "length" if reason == "length" else "stop"
