"""VllmGeneration: the driver's handle on num_engines vLLM replicas (GenerationInterface); with
policy.generation.backend transformers, each replica is an HfWorker instead of a VllmWorker
(the same calls and sampling semantics; backends.py).

    generation = VllmGeneration(cfg.generation, model_path, tokenizer_path, device_type="cpu")
    generation.refit(policy.full_weights_ref(), version=policy.step)   # only when stale
    generation.prepare_for_generation()
    out = generation.generate(prompt_ids, max_new_tokens=budgets, seed=step)
    generation.finish_generation()

Engines are data parallel: prompts are split into contiguous, nearly equal chunks, one per
engine, and results are gathered back in prompt order. A call seeded with `seed` samples
prompt i with request_seed(seed, i, 0) (i its index in the whole batch; nemo_opd.utils.seeds),
or with seed[i] when given one seed per prompt, so the samples do not depend on the number of
engines.

Placement (one Ray actor per engine, see VllmWorker):
- CPU: each engine reserves cpus_per_engine Ray CPUs, 0 by default. The training workers'
  placement group takes whole CPUs (ray.init(num_cpus=2) with two training workers holds
  both), and generation and training take turns in the loop anyway, so the engines time-share
  the cores instead of reserving them. vLLM runs its engine on cpu_threads OpenMP threads
  (OMP_NUM_THREADS in the actor; Ray would set 1 for an actor that reserves no CPU): the loop
  gives it the cores training holds, since training waits while it generates.
- CUDA, not colocated (cfg.colocated.enabled false): one whole GPU per engine.
- CUDA, colocated: gpus_per_engine (a fraction, default 0.5) so that Ray places the engine on a
  GPU that training also uses; vLLM then takes vllm_cfg.gpu_memory_utilization of its memory.
  finish_generation() puts the engines to sleep (weights to host memory, KV cache freed) so
  training gets the memory back, and prepare_for_generation() wakes them.
- With a placement group, engine i runs in its bundle bundles[i] (the run's placement group
  holds one bundle per worker, pinned to the nodes it chose: nemo_opd.distributed.placement),
  taking only what the engine reserves; without one, Ray places the engines.

Refit uses one path in both placements: the full state dict goes into Ray's object store once
(shared memory on a node; the non-colocated "channel"; Ray copies it once to each other node
that reads it) and every engine copies it into its model in place (VllmWorker.update_weights).
The loop hands refit the ObjectRef that the student's rank 0 put there
(Policy.full_weights_ref), so the tensors never pass through the driver; a dict is put by the
driver. Colocated on CUDA the same call runs between training and wake-up: refit
wakes sleeping engines first, since a sleeping engine's weights are not on the device.

An engine that dies in a call (vLLM out of memory, the OOM killer, a crash) or raises ends
the run with a RunError of one line naming the engine, its process and the call; the run's
checkpoints are untouched, so the same command resumes from the newest.
"""

import time
from collections.abc import Callable, Sequence
from typing import Any

import ray
import torch
from ray.exceptions import GetTimeoutError, OutOfMemoryError, RayActorError, RayTaskError
from ray.util.placement_group import PlacementGroup
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from nemo_opd.config import GenerationConfig
from nemo_opd.distributed.nodes import actor_nodes
from nemo_opd.distributed.waits import get_within
from nemo_opd.distributed.worker_group import death_notice
from nemo_opd.errors import RunError
from nemo_opd.generation.backends import engine_worker
from nemo_opd.generation.interface import GenerationOutput
from nemo_opd.generation.vllm_worker import ENGINE_ENV, VllmWorker
from nemo_opd.utils.seeds import request_seed

READY_TIMEOUT_S = 1800.0
"""How long the engines may take to start (a large model on a slow disk takes minutes)."""
CALL_TIMEOUT_S = 600.0
"""How long a bookkeeping call to the engines (start-up times) may take."""


class VllmGeneration:
    """num_engines VllmWorker actors serving one student (see the module docstring).

    Args:
        cfg: the generation section.
        model_path: checkpoint the engines start from (refit replaces its weights).
        tokenizer_path: tokenizer for EOS and stop strings; None = token ids only.
        device_type: "cpu" or "cuda".
        num_engines: data-parallel replicas.
        seed: engine RNG seed (engine i gets seed + i); per-call seeds are given to generate().
        cpus_per_engine: Ray CPUs each engine reserves (default: 0 on CPU, 1 on CUDA).
        cpu_threads: OpenMP threads of each engine on CPU (default: 1, or cpus_per_engine).
        gpus_per_engine: Ray GPUs each engine reserves on CUDA (default: 1, or 0.5 colocated).
        placement: the run's placement group: engine i runs in bundle bundles[i], taking
            cpus_per_engine / gpus_per_engine of it (shared with training when colocated).
        bundles: the bundle of each engine (num_engines of them); default 0, 1, 2, ...
    """

    def __init__(
        self,
        cfg: GenerationConfig,
        model_path: str,
        tokenizer_path: str | None,
        *,
        device_type: str,
        num_engines: int = 1,
        seed: int = 0,
        cpus_per_engine: float | None = None,
        cpu_threads: int | None = None,
        gpus_per_engine: float | None = None,
        placement: PlacementGroup | None = None,
        bundles: Sequence[int] | None = None,
        wait: bool = True,
    ) -> None:
        if not ray.is_initialized():
            raise RuntimeError("VllmGeneration needs Ray: call ray.init() first")
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
        if cfg.stop_strings and tokenizer_path is None:
            raise ValueError("generation.stop_strings need a tokenizer (tokenizer_path is None)")
        self.cfg = cfg
        self.device_type = device_type
        self.colocated = device_type == "cuda" and cfg.colocated.enabled
        self.model_path = model_path
        self.loaded_version: int | None = None
        self.last_refit_time_s = 0.0
        worker_cls, engine_cfg = engine_worker(cfg)  # VllmWorker, or HfWorker (backends.py)
        options = _actor_options(
            device_type,
            self.colocated,
            cpus_per_engine,
            gpus_per_engine,
            cpu_threads,
            engine_env=ENGINE_ENV if worker_cls is VllmWorker else {},
        )
        bundles = list(range(num_engines)) if bundles is None else list(bundles)
        if len(bundles) != num_engines:
            raise ValueError(f"{len(bundles)} bundles given for {num_engines} engines")
        remote_cls = ray.remote(worker_cls)
        self._started = time.perf_counter()
        self.engines = [
            remote_cls.options(**options, **_bundle(placement, bundles[i])).remote(
                model_path, tokenizer_path, engine_cfg, seed + i, self.colocated
            )
            for i in range(num_engines)
        ]
        self.start_time_s: float | None = None
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> float:
        """Block until every engine has started (construct with wait=False to let the engines
        start while other workers load); returns the seconds since construction. An engine
        that failed to start raises here, after all engines are shut down."""
        if self.start_time_s is None:
            try:
                ray.get([engine.ready.remote() for engine in self.engines], timeout=READY_TIMEOUT_S)
            except GetTimeoutError as error:
                self.shutdown()
                raise RunError(
                    f"vLLM: {len(self.engines)} engine(s) did not start within "
                    f"{READY_TIMEOUT_S:.0f} s: still loading the model, or never scheduled "
                    "because the cluster lacks the CPUs or GPUs they ask for (`ray status` "
                    "shows what is free)"
                ) from error
            except RayActorError as error:
                self.shutdown()
                raise RunError(f"vLLM could not start: {_start_failure(error)}") from error
            except BaseException:
                self.shutdown()
                raise
            self.start_time_s = time.perf_counter() - self._started
        return self.start_time_s

    def startup_marks(self) -> list[dict[str, float]]:
        """Each engine's start-up times (nemo_opd.utils.startup), in engine order."""
        refs = [engine.startup_marks.remote() for engine in self.engines]
        return get_within(refs, CALL_TIMEOUT_S, "vLLM engines reporting their start-up times")

    def nodes(self) -> list[tuple[str, str]]:
        """(node id, node address) of each engine, in engine order, as Ray placed them."""
        return actor_nodes(self.engines)

    def generate(
        self,
        prompts: list[list[int]],
        *,
        max_new_tokens: list[int] | int | None = None,
        greedy: bool = False,
        seed: int | list[int] | None = None,
        temperature: float | None = None,
    ) -> GenerationOutput:
        """One continuation per prompt (B prompts of token ids), in prompt order.

        max_new_tokens: per prompt (B ints), one int for all, or None for cfg.max_new_tokens; a
            budget of 0 yields an empty continuation with finish reason "length".
        greedy: argmax decoding (also when cfg.temperature is 0).
        seed: base seed (prompt i samples with request_seed(seed, i, 0)), or B seeds (prompt
            i samples with seed[i]). None uses the engines' own RNG.
        temperature: sampling temperature of this call; None uses cfg.temperature.
        """
        budgets = _budgets(max_new_tokens, self.cfg.max_new_tokens, len(prompts))
        seeds = _seeds(seed, len(prompts))
        active = [i for i, budget in enumerate(budgets) if budget > 0]
        sampling = self._sampling(greedy, temperature)
        chunks = _split(active, len(self.engines))
        started = time.perf_counter()
        calls = [
            (
                index,
                self.engines[index].generate.remote(
                    [prompts[i] for i in chunk],
                    [budgets[i] for i in chunk],
                    sampling,
                    None if seeds is None else [seeds[i] for i in chunk],
                ),
            )
            for index, chunk in enumerate(chunks)
            if chunk
        ]
        results = self._results(calls, "generating")
        wall = time.perf_counter() - started
        return _gather(len(prompts), [c for c in chunks if c], results, wall)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t), t = 1..n-1, of each full sequence at temperature 1
        (vLLM prompt log-probs; see VllmWorker.score). For probes and tests."""
        chunks = _split(list(range(len(sequences))), len(self.engines))
        calls = [
            (index, self.engines[index].score.remote([sequences[i] for i in chunk]))
            for index, chunk in enumerate(chunks)
            if chunk
        ]
        return [row for rows in self._results(calls, "scoring") for row in rows]

    def refit(self, weights: dict[str, torch.Tensor] | ray.ObjectRef, version: int) -> bool:
        """Push `weights` (full tensors, HF names, lm_head included even when tied), or an
        ObjectRef of them (Policy.full_weights_ref), to every engine unless `version` is already
        loaded. Returns whether weights were pushed."""
        if version == self.loaded_version:
            return False
        self.prepare_for_generation()  # a sleeping engine's weights are not on the device
        started = time.perf_counter()
        # One copy in the object store, read by every engine.
        ref = weights if isinstance(weights, ray.ObjectRef) else ray.put(weights)
        self._on_every_engine(lambda engine: engine.update_weights.remote(ref), "loading weights")
        self.last_refit_time_s = time.perf_counter() - started
        self.loaded_version = version
        return True

    def prepare_for_generation(self) -> None:
        """Wake the engines (colocated on CUDA); a no-op otherwise."""
        if self.colocated:
            self._on_every_engine(lambda engine: engine.wake_up.remote(), "waking up")

    def finish_generation(self) -> None:
        """Put the engines to sleep so training gets the GPU memory (colocated on CUDA)."""
        if self.colocated:
            self._on_every_engine(lambda engine: engine.sleep.remote(), "going to sleep")

    def shutdown(self) -> None:
        """Kill the engine actors (idempotent)."""
        for engine in self.engines:
            ray.kill(engine)
        self.engines = []

    def _on_every_engine(self, call: Callable[[Any], ray.ObjectRef], doing: str) -> list:
        """call(engine) on every engine; their results in engine order (see _results)."""
        return self._results([(i, call(engine)) for i, engine in enumerate(self.engines)], doing)

    def _results(self, calls: list[tuple[int, ray.ObjectRef]], doing: str) -> list:
        """The results of calls (engine index, ObjectRef of its call), in order. The first
        failure to complete ends the run: an engine that died or raised is a RunError naming
        it (and the call, `doing`), with its own error as the cause."""
        engine_of = {ref: index for index, ref in calls}
        results = {}
        pending = list(engine_of)
        while pending:
            [done], pending = ray.wait(pending, num_returns=1)
            try:
                results[done] = ray.get(done)
            except (RayActorError, RayTaskError, OutOfMemoryError) as error:
                raise RunError(self._failure(engine_of[done], doing, error)) from error
        return [results[ref] for _, ref in calls]

    def _failure(self, engine: int, doing: str, error: Exception) -> str:
        """One line: which engine failed while `doing` what, how, and what is left."""
        what = f"vLLM engine {engine} (of {len(self.engines)}, serving {self.model_path})"
        if isinstance(error, RayTaskError):
            how = f"raised {_first_line(getattr(error, 'cause', None) or error)}"
        else:
            how = f"died ({_with_memory_hint(death_notice(error))})"
        return (
            f"{what} {how} while {doing}; the checkpoints saved so far are intact: run the "
            "same command to resume from the newest"
        )

    def _sampling(self, greedy: bool, temperature: float | None = None) -> dict:
        """The sampling settings every request of one generate() call shares."""
        temperature = self.cfg.temperature if temperature is None else temperature
        greedy = greedy or temperature == 0
        return {
            "temperature": 0.0 if greedy else temperature,
            "top_p": 1.0 if greedy else self.cfg.top_p,
            "top_k": None if greedy else self.cfg.top_k,
            "stop_token_ids": self.cfg.stop_token_ids,
            "stop_strings": self.cfg.stop_strings,
        }


def _actor_options(
    device_type: str,
    colocated: bool,
    cpus: float | None,
    gpus: float | None,
    cpu_threads: int | None = None,
    engine_env: dict[str, str] = ENGINE_ENV,
) -> dict:
    """Ray options of one engine actor (resources, and engine_env: the env vLLM must see at
    import; none for the transformers engine)."""
    env = dict(engine_env)
    if device_type == "cpu":
        resources = {"num_cpus": 0.0 if cpus is None else cpus, "num_gpus": 0}
        threads = cpu_threads or max(1, int(cpus or 1))
        env["OMP_NUM_THREADS"] = str(threads)
    else:
        default_gpus = 0.5 if colocated else 1.0
        resources = {
            "num_cpus": 1.0 if cpus is None else cpus,
            "num_gpus": default_gpus if gpus is None else gpus,
        }
    return {**resources, "runtime_env": {"env_vars": env}}


def _bundle(placement: PlacementGroup | None, index: int) -> dict:
    """The scheduling option that puts an engine into bundle `index` of a shared placement."""
    if placement is None:
        return {}
    strategy = PlacementGroupSchedulingStrategy(placement, placement_group_bundle_index=index)
    return {"scheduling_strategy": strategy}


def _budgets(max_new_tokens: list[int] | int | None, default: int, num_prompts: int) -> list[int]:
    """Per-prompt token budgets (num_prompts ints >= 0)."""
    if max_new_tokens is None:
        max_new_tokens = default
    if isinstance(max_new_tokens, int):
        budgets = [max_new_tokens] * num_prompts
    else:
        budgets = list(max_new_tokens)
    if len(budgets) != num_prompts or any(b < 0 for b in budgets):
        raise ValueError(
            f"max_new_tokens needs {num_prompts} non-negative budgets, got {max_new_tokens}"
        )
    return budgets


def _seeds(seed: int | list[int] | None, num_prompts: int) -> list[int] | None:
    """One seed per prompt (num_prompts ints): request_seed(seed, i, 0) for a base seed, or
    the list given."""
    if seed is None:
        return None
    if isinstance(seed, int):
        return [request_seed(seed, i, 0) for i in range(num_prompts)]
    if len(seed) != num_prompts:
        raise ValueError(f"seed needs one seed per prompt ({num_prompts}), got {len(seed)}")
    return list(seed)


def _split(indices: list[int], parts: int) -> list[list[int]]:
    """Contiguous chunks of `indices` whose sizes differ by at most one (parts lists)."""
    base, extra = divmod(len(indices), parts)
    chunks, start = [], 0
    for part in range(parts):
        size = base + (part < extra)
        chunks.append(indices[start : start + size])
        start += size
    return chunks


def _gather(
    num_prompts: int, chunks: list[list[int]], results: list[GenerationOutput], wall_s: float
) -> GenerationOutput:
    """Put each engine's results back at their prompts' positions; prompts that were not sent
    (budget 0) get an empty continuation that finished on "length"."""
    out = GenerationOutput(
        token_ids=[[] for _ in range(num_prompts)],
        logprobs=[[] for _ in range(num_prompts)],
        finish_reasons=["length"] * num_prompts,
    )
    for chunk, result in zip(chunks, results, strict=True):
        for j, i in enumerate(chunk):
            out.token_ids[i] = result.token_ids[j]
            out.logprobs[i] = result.logprobs[j]
            out.finish_reasons[i] = result.finish_reasons[j]
    tokens = sum(len(ids) for ids in out.token_ids)
    out.metrics = {
        "generation_time_s": wall_s,
        "generated_tokens": float(tokens),
        "generation_tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0,
    }
    return out


def _start_failure(error: RayActorError) -> str:
    """Why an engine died while starting, with what to change when it ran out of memory."""
    return _with_memory_hint(death_notice(error))


def _with_memory_hint(notice: str) -> str:
    """An engine's death notice, with what to change when it ran out of memory."""
    if "memory" in notice.lower():
        notice += (
            " (policy.generation.vllm_cfg: gpu_memory_utilization is, on CPU, a fraction of the "
            "host's memory less what the process holds; kv_cache_memory_bytes gives the KV "
            "cache a fixed size instead)"
        )
    return notice


def _first_line(error: BaseException) -> str:
    """'<type>: <first line of its message>', at most 300 characters (an engine's own
    exception can span pages)."""
    lines = str(error).strip().splitlines()
    text = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return text if len(text) <= 300 else text[:297] + "..."
