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

Each engine is a worker of an EngineWorker class (VllmWorker or HfWorker: backends.py), run by
any executor (nemo_opd.distributed.worker_group): a Ray actor, a process of this machine (the
processes executor, given the environment the actor's options name), or an object in the
driver's process (the local executor: one engine beside the student and the teacher, no Ray;
on CPU it computes on the process's torch threads, which the run sets, and sleep mode works in
place).

Placement under Ray (one actor per engine):
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

Refit uses one path in both placements: the full state dict is put once where every engine
reads it (Ray's object store: shared memory on a node, copied once to each other node that
reads it; in one process, the tensors themselves) and every engine copies it into its model in
place (VllmWorker.update_weights). The loop hands refit the handle that the student's rank 0
put there (Policy.full_weights_ref), so the tensors never pass through the driver; a dict is
put by the driver. Colocated on CUDA the same call runs between training and wake-up: refit
wakes sleeping engines first, since a sleeping engine's weights are not on the device.

Refit that copies nothing (share_student): in one process (the local executor), with the
transformers backend and one engine, the engine can generate from the student's own module
instead of a copy. It starts without a model, share_module hands it the student's (after the
student has started), and refit then only records the version: the loop hands it IN_PLACE
instead of gathered weights. Lockstep only (distillation.max_staleness 0): the module must not
train while the engine generates from it (setup decides: backends.shares_student_module).

An engine that dies in a call (vLLM out of memory, the OOM killer, a crash) or raises ends
the run with a RunError of one line naming the engine, its process and the call; the run's
checkpoints are untouched, so the same command resumes from the newest.
"""

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

from nemo_opd.config import GenerationConfig
from nemo_opd.distributed.worker_group import Executor, WorkerError, start_workers
from nemo_opd.errors import RunError
from nemo_opd.generation.backends import engine_worker
from nemo_opd.generation.hf_worker import HfWorker
from nemo_opd.generation.interface import IN_PLACE, EngineWorker, GenerationOutput
from nemo_opd.generation.vllm_worker import ENGINE_ENV, VllmWorker
from nemo_opd.utils.seeds import request_seed

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

READY_TIMEOUT_S = 1800.0
"""How long the engines may take to start (a large model on a slow disk takes minutes)."""
CALL_TIMEOUT_S = 600.0
"""How long a bookkeeping call to the engines (start-up times) may take."""
STOP_TIMEOUT_S = 60.0
"""How long shutdown waits to stop an engine of this process (a call in flight on another
thread finishes first); past it the engine is let go unstopped, and shutdown raises."""


class VllmGeneration:
    """num_engines engine workers serving one student (see the module docstring).

    Args:
        cfg: the generation section.
        model_path: checkpoint the engines start from (refit replaces its weights).
        tokenizer_path: tokenizer for EOS and stop strings; None = token ids only.
        device_type: "cpu" or "cuda".
        num_engines: data-parallel replicas.
        seed: engine RNG seed (engine i gets seed + i); per-call seeds are given to generate().
        cpus_per_engine: Ray CPUs each engine reserves (default: 0 on CPU, 1 on CUDA).
        cpu_threads: OpenMP threads of each engine on CPU under Ray (default: 1, or
            cpus_per_engine); in one process the engine runs on the process's threads.
        gpus_per_engine: Ray GPUs each engine reserves on CUDA (default: 1, or 0.5 colocated).
        placement: the run's placement group: engine i runs in bundle bundles[i], taking
            cpus_per_engine / gpus_per_engine of it (shared with training when colocated).
        bundles: the bundle of each engine (num_engines of them); default 0, 1, 2, ...
        wait: block until every engine has started (see wait_until_ready).
        executor: "ray" (an actor per engine), "processes" (a process of this machine per
            engine) or "local" (the engines in this process).
        share_student: the one engine loads no model and generates from the student's own
            module once share_module gives it (the transformers backend in this process only);
            a refit then copies nothing.
        The engine workers' class (an EngineWorker) is cfg.backend's (generation/backends.py).
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
        placement: "PlacementGroup | None" = None,
        bundles: Sequence[int] | None = None,
        wait: bool = True,
        executor: Executor = "ray",
        share_student: bool = False,
    ) -> None:
        if device_type not in ("cpu", "cuda"):
            raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
        if cfg.stop_strings and tokenizer_path is None:
            raise ValueError("generation.stop_strings need a tokenizer (tokenizer_path is None)")
        self.cfg = cfg
        self.device_type = device_type
        self.colocated = device_type == "cuda" and cfg.colocated.enabled
        self.model_path = model_path
        self.num_engines = num_engines
        self.loaded_version: int | None = None
        self.last_refit_time_s = 0.0
        worker_cls, engine_cfg = engine_worker(cfg)  # VllmWorker, or HfWorker (backends.py)
        if share_student and (
            worker_cls is not HfWorker or executor != "local" or num_engines != 1
        ):
            raise ValueError(
                "share_student needs the transformers backend's one engine in this process "
                f"(got {worker_cls.__name__}, executor {executor}, {num_engines} engines)"
            )
        self.shares_student = share_student
        self.in_this_process = executor == "local"
        engine_model = None if share_student else model_path
        options = _actor_options(
            device_type,
            self.colocated,
            cpus_per_engine,
            gpus_per_engine,
            cpu_threads,
            engine_env=ENGINE_ENV if worker_cls is VllmWorker else {},
        )
        if bundles is not None and len(bundles) != num_engines:
            raise ValueError(f"{len(bundles)} bundles given for {num_engines} engines")
        self.engine_name = "vLLM" if worker_cls is VllmWorker else "transformers"
        self._started = time.perf_counter()
        self.start_time_s: float | None = None
        try:
            self.engines = start_workers(
                executor,
                worker_cls,
                num_engines,
                lambda i: (engine_model, tokenizer_path, engine_cfg, seed + i, self.colocated),
                name=self.engine_name,
                rendezvous=False,
                wait=False,
                timeout_s=None,  # a generate call takes as long as its batch takes
                start_timeout_s=READY_TIMEOUT_S,
                ray_options=lambda i: options,
                placement=placement,
                bundles=bundles,
            )
        except WorkerError as error:  # workers in this process start here
            raise RunError(_start_failure(error, num_engines, self.engine_name)) from error
        if wait:
            self.wait_until_ready()

    def wait_until_ready(self) -> float:
        """Block until every engine has started (construct with wait=False to let the engines
        start while other workers load); returns the seconds since construction. An engine
        that failed to start raises here, after all engines are shut down."""
        if self.start_time_s is None:
            try:
                self.engines.wait_until_ready()
            except WorkerError as error:
                raise RunError(_start_failure(error, self.num_engines, self.engine_name)) from error
            self.start_time_s = time.perf_counter() - self._started
        return self.start_time_s

    def startup_marks(self) -> list[dict[str, float]]:
        """Each engine's start-up times (nemo_opd.utils.startup), in engine order."""
        return self._on_every_engine(
            EngineWorker.startup_marks, "reporting start-up times", timeout_s=CALL_TIMEOUT_S
        )

    def nodes(self) -> list[tuple[str, str]]:
        """(node id, node address) of each engine, in engine order, as the executor placed
        them."""
        return self.engines.nodes()

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
        chunks = _split(active, self.engines.size)
        busy = [index for index, chunk in enumerate(chunks) if chunk]

        def request(index: int) -> tuple:
            chunk = chunks[index]
            return (
                [prompts[i] for i in chunk],
                [budgets[i] for i in chunk],
                sampling,
                None if seeds is None else [seeds[i] for i in chunk],
            )

        started = time.perf_counter()
        results = self._call(EngineWorker.generate, request, busy, "generating")
        wall = time.perf_counter() - started
        return _gather(len(prompts), [chunks[index] for index in busy], results, wall)

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(token t | tokens < t), t = 1..n-1, of each full sequence at temperature 1
        (vLLM prompt log-probs; see VllmWorker.score). For probes and tests."""
        chunks = _split(list(range(len(sequences))), self.engines.size)
        busy = [index for index, chunk in enumerate(chunks) if chunk]
        results = self._call(
            EngineWorker.score,
            lambda index: ([sequences[i] for i in chunks[index]],),
            busy,
            "scoring",
        )
        return [row for rows in results for row in rows]

    def share_module(self, module: torch.nn.Module) -> None:
        """Give the engine started with share_student the student's own module (the model of
        the student's worker in this process: Policy.local_module) to generate from."""
        if not self.shares_student:
            raise ValueError("share_module: this generation was not started with share_student")
        self._on_every_engine(HfWorker.share_module, "taking the student's module", module)

    def refit(self, weights: dict[str, torch.Tensor] | Any, version: int) -> bool:
        """Push `weights` (full tensors, HF names, lm_head included even when tied), or a
        handle on them (Policy.full_weights_ref), to every engine unless `version` is already
        loaded. Returns whether weights were pushed. An engine that shares the student's module
        (share_student) only records `version`: pass IN_PLACE (no weights gathered)."""
        if version == self.loaded_version:
            return False
        if self.shares_student:
            self.loaded_version = version
            return False
        if weights is IN_PLACE:
            raise ValueError("refit: IN_PLACE is for an engine that shares the student's module")
        self.prepare_for_generation()  # a sleeping engine's weights are not on the device
        started = time.perf_counter()
        # One copy where every engine reads it.
        handle = self.engines.put(weights) if isinstance(weights, dict) else weights
        self._on_every_engine(EngineWorker.update_weights, "loading weights", handle)
        self.last_refit_time_s = time.perf_counter() - started
        self.loaded_version = version
        return True

    def prepare_for_generation(self) -> None:
        """Wake the engines (colocated on CUDA); a no-op otherwise."""
        if self.colocated:
            self._on_every_engine(EngineWorker.wake_up, "waking up")

    def finish_generation(self) -> None:
        """Put the engines to sleep so training gets the GPU memory (colocated on CUDA)."""
        if self.colocated:
            self._on_every_engine(EngineWorker.sleep, "going to sleep")

    def shutdown(self) -> None:
        """Stop the engines (idempotent: a group shut down has no engines left). Engines in
        this process (the local executor) are stopped first (EngineWorker.stop), not left for a
        garbage collection to find in the middle of other work; one that fails to stop is let
        go all the same. Engines of other processes end with them."""
        try:
            if self.in_this_process:
                self._on_every_engine(EngineWorker.stop, "stopping", timeout_s=STOP_TIMEOUT_S)
        finally:
            self.engines.shutdown()

    def _on_every_engine(
        self, method: Callable, doing: str, *args: Any, timeout_s: float | None = None
    ) -> list:
        """method(engine, *args) on every engine; their results in engine order (see _call)."""
        every = list(range(self.engines.size))
        return self._call(method, lambda index: args, every, doing, timeout_s)

    def _call(
        self,
        method: Callable,
        args_of: Callable[[int], tuple],
        engines: list[int],
        doing: str,
        timeout_s: float | None = None,
    ) -> list:
        """method(engine, *args_of(engine)) on `engines`, their results in that order. The
        first failure ends the run: an engine that died or raised is a RunError naming it
        (and the call, `doing`), with its own error as the cause."""
        try:
            return self.engines.run_each(method, args_of, engines, timeout_s=timeout_s)
        except WorkerError as error:
            raise RunError(self._failure(error, doing)) from error

    def _failure(self, error: WorkerError, doing: str) -> str:
        """One line: which engine failed while `doing` what, how, and what is left."""
        if error.rank is None:  # a bookkeeping call past its time-out
            return f"{error} while {doing}"
        what = (
            f"{self.engine_name} engine {error.rank} (of {self.num_engines}, serving "
            f"{self.model_path})"
        )
        if error.died:
            how = f"died ({_with_memory_hint(error.detail)})"
        else:
            how = f"raised {_first_line(error.cause or error)}"
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


def _start_failure(error: WorkerError, engines: int, name: str = "vLLM") -> str:
    """Why the `name` engines ("vLLM" or "transformers") did not start, with what to change
    when one ran out of memory or was never scheduled."""
    if error.rank is None:
        return (
            f"{name}: {engines} engine(s) did not start within {READY_TIMEOUT_S:.0f} s: still "
            "loading the model, or never scheduled because the cluster lacks the CPUs or GPUs "
            "they ask for (`ray status` shows what is free)"
        )
    notice = error.detail if error.died else f"raised {_first_line(error.cause or error)}"
    return f"{name} could not start: {_with_memory_hint(notice)}"


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
