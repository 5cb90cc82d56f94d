"""Policy: the driver-side facade over one model's worker group (student or teacher).

    policy = Policy(cfg.policy, cfg.cluster)                      # trains
    teacher = Policy(cfg.teacher, cfg.cluster, optimizer=False)   # frozen
    values, ids = teacher.get_topk_logits(batch, k)               # [B, S, k] fp32 / int32
    batch["teacher_topk_logprobs"], batch["teacher_topk_indices"] = values, ids
    metrics = policy.train(batch, DistillationLossFn.from_config(cfg.loss_fn))

Data are dicts of CPU tensors (see nemo_opd.data.batching). Scoring calls shard rows over
data-parallel ranks (padding to a multiple of dp) and replicate each shard over the tp and cp
ranks of its replica; results come back from the (cp=0, tp=0) rank of every replica, in order.
A teacher with another tokenizer is sent the student's conversations instead (set_rendering,
then score_rendered): each replica renders its own rows in the teacher's tokens.

The workers run on any executor (nemo_opd.distributed.worker_group): Ray actors, one process
per rank, processes of this machine forked without Ray, or one PolicyWorker in the driver's
process; the calls and the answers are the same.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import torch

from nemo_opd.config import ClusterConfig, PolicyConfig
from nemo_opd.data.batching import TensorBatch, pad_batch_to_multiple, shard_for_data_parallel
from nemo_opd.distributed.cluster import WorkerResources, resolve_device_type
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.distributed.worker_group import Executor, start_workers
from nemo_opd.policy.engines import ENGINE_MODULES
from nemo_opd.policy.trained_positions import unpacked
from nemo_opd.policy.worker import PolicyWorker, answers_for_its_replica

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup

    from nemo_opd.scoring.rendering import TeacherRendering


class Policy:
    """A model on a group of workers: train, score, save/load, offload, export weights.

    Args:
        cfg: the model's section (policy or teacher).
        cluster: the cluster section.
        optimizer: build optimizer and scheduler state (False for a teacher).
        num_workers: workers to use; default cluster.world_size.
        name: shown in error messages.
        total_steps: optimizer steps of the run (for decaying schedules).
        placement: (Ray) a placement group shared with other colocated models; None reserves
            one for this policy alone.
        share: (Ray) the fraction of each shared bundle this policy's workers take.
        wait: block until every worker has built its engine; with False they start in the
            background and wait_until_ready() must be called before the policy is used.
        threads: torch threads of each worker on CPU (default: cluster.cpus_per_worker); in one
            process (the local executor) the process's thread count.
        executor: "ray" (a Ray actor per rank) or "local" (one rank in this process).
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        cluster: ClusterConfig,
        *,
        optimizer: bool = True,
        num_workers: int | None = None,
        name: str = "policy",
        total_steps: int | None = None,
        placement: PlacementGroup | None = None,
        share: float = 1.0,
        wait: bool = True,
        threads: int | None = None,
        executor: Executor = "ray",
    ) -> None:
        self.cfg = cfg
        world = num_workers or cluster.world_size
        self.dims = _parallel_dims(cfg, world, name)
        device_type = resolve_device_type(cluster, executor)
        self.dims.device_type = device_type
        resources = WorkerResources(device_type, cluster.cpus_per_worker)
        args = (
            cfg.model_dump(include=set(PolicyConfig.model_fields)),  # not a teacher's `server`
            self.dims,
            device_type,
            threads or cluster.cpus_per_worker,
            optimizer,
            total_steps,
        )
        self.workers = start_workers(
            executor,
            PolicyWorker,
            world,
            lambda rank: (rank, *args),
            name=name,
            wait=wait,
            ray_options=lambda rank: {
                "num_cpus": resources.cpus * share,
                "num_gpus": share if device_type == "cuda" else 0,
            },
            placement=placement,
            reserve=resources,
            preload=[ENGINE_MODULES[cfg.backend]],
        )
        self.leaders = [r for r in range(world) if answers_for_its_replica(self.dims, r)]
        self.executor = executor

    def wait_until_ready(self) -> None:
        """Block until every worker has built its engine (see `wait`); a worker that failed
        raises WorkerError."""
        self.workers.wait_until_ready()

    # ---------------------------------------------------------------- scoring

    def get_logprobs(self, data: Mapping, temperature: float = 1.0) -> torch.Tensor:
        """[B, S] fp32: position t holds log p(token t+1 | tokens <= t); 0 at t >= length-1."""
        outputs = self._score(data, PolicyWorker.get_logprobs, temperature)
        return torch.cat(outputs, dim=0)

    def get_topk_logits(
        self, data: Mapping, k: int, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k log-probs over the full vocabulary [B, S, k] fp32 (descending) and their
        global ids [B, S, k] int32; position t scores the distribution of token t+1."""
        outputs = self._score(data, PolicyWorker.get_topk_logits, k, temperature)
        values = torch.cat([v for v, _ in outputs], dim=0)
        indices = torch.cat([i for _, i in outputs], dim=0)
        return values, indices

    def get_hidden_states(self, data: Mapping) -> torch.Tensor:
        """The final hidden states of every position [B, S, H] (what the LM head reads), in
        the model's compute precision; 0 past each row's length."""
        outputs = self._score(data, PolicyWorker.get_hidden_states)
        return torch.cat(outputs, dim=0)

    def score(
        self,
        data: Mapping,
        *,
        topk: int = 0,
        temperature: float = 1.0,
        logprobs: bool = False,
        hidden: bool = False,
        trained_only: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Any of the top-k ("topk_logprobs", "topk_indices" [B, S, k]), the next-token
        log-probs ("logprobs" [B, S]) and the final hidden states ("hidden_states" [B, S, H])
        of every position, in one forward pass (what a teacher sends; see get_topk_logits,
        get_logprobs and get_hidden_states for each alone). With trained_only all of them only
        where the next token is trained (data's token_mask; 0 elsewhere): the LM head skips
        the prompts' positions, and the workers send the trained positions' values alone
        (trained_positions.py)."""
        shards, size = even_shards(data, self.dims.dp)
        outputs = self._run_on_replicas(
            PolicyWorker.score,
            [dict(shard) for shard in shards],
            topk,
            temperature,
            logprobs,
            hidden,
            trained_only,
        )
        return joined(_in_place(outputs, shards, trained_only), size)

    def set_rendering(self, rendering: TeacherRendering) -> None:
        """Give every worker how the student's conversations read in this model's tokens (a
        teacher with another tokenizer), for score_rendered; sent once."""
        self.workers.run(PolicyWorker.set_rendering, self.workers.put(rendering))

    def score_rendered(
        self,
        data: Mapping,
        message_logs: list[list[dict]],
        *,
        topk: int = 0,
        temperature: float = 1.0,
        logprobs: bool = False,
    ) -> dict[str, torch.Tensor]:
        """score() of the student's rows by a teacher with another tokenizer (set_rendering
        first): each replica renders its shard's conversations in its own tokens, scores them
        and moves the answers onto the student's positions and vocabulary
        (nemo_opd.scoring.rendering.score_rendered), so that the driver only ships
        conversations and collects answers.

        Returns:
            score()'s top-k and log-probs in the student's positions ([B, S, k], [B, S]) and
            "xtok_counts" [B, C] (the rows' counts for the cross-tokenizer metrics).
        """
        payloads, size = rendered_shards(data, message_logs, self.dims.dp)
        outputs = self._run_on_replicas(
            PolicyWorker.score_rendered, payloads, topk, temperature, logprobs
        )
        return joined(outputs, size)

    def hold_self_teacher(self, source: str, decay: float = 0.0, refresh_steps: int = 1) -> None:
        """Make this student its own teacher (teacher.source; docs/self_distillation.md): every
        worker holds the teacher's weights from now on: "student" the live ones, "ema" an
        average updated after each train() call with `decay`, "lagged" a snapshot taken again
        every `refresh_steps` train() calls; checkpoints save them and load restores them."""
        self.workers.run(PolicyWorker.hold_self_teacher, source, decay, refresh_steps)

    def score_as_teacher(self, data: Mapping, **need) -> dict[str, torch.Tensor]:
        """score(data, **need) with the self-teacher's weights (hold_self_teacher first), no
        gradient; with hidden=True the workers keep that pass's LM head as the teacher's."""
        shards, size = even_shards(data, self.dims.dp)
        outputs = self._run_on_replicas(
            PolicyWorker.score_as_teacher, [dict(shard) for shard in shards], need
        )
        return joined(_in_place(outputs, shards, need.get("trained_only", False)), size)

    def load_teacher_head(self, model_dir: str, precision: str) -> None:
        """Give every worker its rows of a teacher's LM head (frozen, in `precision`): the loss
        then reads the teacher's hidden states (loss_fn.support full or student_topk)."""
        self.workers.run(PolicyWorker.load_teacher_head, model_dir, precision)

    def _score(self, data: Mapping, method: Callable, *args: Any) -> list:
        """Per-row outputs of `method` on every replica, in row order (padding rows dropped)."""
        shards, size = even_shards(data, self.dims.dp)
        outputs = self._run_on_replicas(method, [dict(shard) for shard in shards], *args)
        return _trim(outputs, size)

    # ---------------------------------------------------------------- training

    def train(
        self, data: Mapping, loss_fn: Callable, global_batch_size: int | None = None
    ) -> dict[str, list[float]]:
        """One optimizer step per global batch of `data`'s rows.

        Args:
            data: input_ids, input_lengths, token_mask, sample_mask, teacher_topk_logprobs,
                teacher_topk_indices; B a multiple of the global batch.
            loss_fn: e.g. DistillationLossFn (see Engine.train for the call signature).
            global_batch_size: rows per optimizer step (a multiple of the data-parallel size);
                None: train_global_batch_size.

        Returns:
            {metric: [value per step]} (loss, forward_kl, ..., grad_norm, lr, ...).
        """
        global_batch = global_batch_size or self.cfg.train_global_batch_size
        shards = shard_for_data_parallel(TensorBatch(data), self.dims.dp, global_batch)
        results = self._run_on_replicas(
            PolicyWorker.train,
            [dict(shard) for shard in shards],
            self.workers.put(loss_fn),
            global_batch,
        )
        return results[0]  # every rank returns the same globally reduced metrics

    def evaluate(self, data: Mapping, loss_fn: Callable) -> dict[str, float]:
        """The loss function's metrics on `data` (train's fields, any number of rows) without
        updating the model: e.g. the validation KL between student and teacher."""
        shards, _ = even_shards(data, self.dims.dp)
        results = self._run_on_replicas(
            PolicyWorker.evaluate, [dict(shard) for shard in shards], self.workers.put(loss_fn)
        )
        return results[0]

    # ---------------------------------------------------------------- dispatch

    def _run_on_replicas(self, method: Callable, shards: list, *args: Any) -> list:
        """Send shard d (plain data: a dict of tensors, ...) to every rank of replica d (each
        shard put once: workers.put), run method(worker, shard, *args) on every rank and return
        the results of each replica's (cp = 0, tp = 0) rank, in dp order."""
        handles = [self.workers.put(shard) for shard in shards]
        results = self.workers.run_each(
            method, lambda rank: (handles[self.dims.coordinates(rank)["dp"]], *args)
        )
        return [results[rank] for rank in self.leaders]

    # ---------------------------------------------------------------- state

    def save(self, path: str) -> None:
        """Write a checkpoint directory atomically (layout in docs/policy.md)."""
        self.workers.run(PolicyWorker.save, path)

    def export(self, path: str, dtype: str | None = None) -> None:
        """Write the trained model in Hugging Face format into `path` atomically, its weights in
        `dtype` (default: the policy's precision) and no training state (a LoRA student: the
        merged model, and its peft adapter in `path`/adapter)."""
        dtype = dtype or self.cfg.precision
        self.workers.run(PolicyWorker.export, path, dtype)

    def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG state and step from `path`."""
        self.workers.run(PolicyWorker.load, path)

    def offload(self) -> None:
        """Move weights and optimizer state to host memory (e.g. while vLLM generates)."""
        self.workers.run(PolicyWorker.offload)

    def onload(self) -> None:
        """Move weights and optimizer state back to the devices."""
        self.workers.run(PolicyWorker.onload)

    def full_weights(self) -> dict[str, torch.Tensor]:
        """Every weight as a full CPU tensor in Hugging Face naming (lm_head included even when
        tied), for refitting a generation engine."""
        return self.workers.run(PolicyWorker.full_weights)[0]

    def full_weights_ref(self) -> Any:
        """full_weights() as a handle a generation engine reads directly, without a copy
        through the driver (run_and_put: under Ray an ObjectRef that rank 0 put into the object
        store; in one process the tensors themselves)."""
        return self.workers.run_and_put(PolicyWorker.full_weights)[0]

    def local_module(self) -> torch.nn.Module:
        """The model of this policy's one worker, which runs in this process (the local
        executor): the DTensor engine's transformers module itself, for a generation engine to
        read in place (VllmGeneration.share_module). ValueError under Ray or another engine."""
        if self.executor != "local" or self.workers.size != 1:
            raise ValueError(
                "local_module: the model lives in this process only under the local executor "
                "with one worker"
            )
        return self.workers.run(PolicyWorker.module)[0]

    def nodes(self) -> list[tuple[str, str]]:
        """(node id, node address) of each worker, by rank, as the executor placed them."""
        return self.workers.nodes()

    def startup_marks(self) -> list[dict[str, float]]:
        """Each rank's start-up times (nemo_opd.utils.startup), in rank order."""
        return self.workers.run(PolicyWorker.startup_marks)

    @property
    def step(self) -> int:
        """Optimizer steps taken so far."""
        return self.workers.run(PolicyWorker.step, ranks=[0])[0]

    def shutdown(self) -> None:
        """Stop the workers and free their resources."""
        self.workers.shutdown()


def _parallel_dims(cfg: PolicyConfig, world: int, name: str) -> ParallelDims:
    """ParallelDims of the enabled backend, with the config keys named in errors."""
    tp, cp = cfg.tensor_parallel_size, cfg.context_parallel_size
    tp_key = "tensor_model_parallel_size" if cfg.backend == "megatron" else "tensor_parallel_size"
    if world % (tp * cp):
        raise ValueError(
            f"{name}.{cfg.backend}_cfg: {tp_key} ({tp}) x context_parallel_size ({cp}) = "
            f"{tp * cp} must divide the {world} workers (cluster.num_nodes x "
            "cluster.gpus_per_node)"
        )
    return ParallelDims(world, tp=tp, cp=cp)


def even_shards(data: Mapping, dp: int) -> tuple[list[TensorBatch], int]:
    """(dp contiguous shards of `data` padded to a multiple of dp, the unpadded size)."""
    batch, size = pad_batch_to_multiple(TensorBatch(data), dp)
    return batch.chunk(batch.size // dp), size


def rendered_shards(
    data: Mapping, message_logs: list[list[dict]], dp: int
) -> tuple[list[tuple[dict, list]], int]:
    """What each of dp replicas is sent by score_rendered: (its rows as even_shards cuts them,
    their conversations; a padding row's is row 0's, as its tensors are), and the unpadded
    size."""
    shards, size = even_shards(data, dp)
    padded = list(message_logs) + [message_logs[0]] * (sum(s.size for s in shards) - size)
    starts = [0, *itertools.accumulate(shard.size for shard in shards)]
    return [
        (dict(shard), padded[start:end])
        for shard, start, end in zip(shards, starts[:-1], starts[1:], strict=True)
    ], size


def joined(outputs: list[dict[str, torch.Tensor]], size: int) -> dict[str, torch.Tensor]:
    """The replicas' {name: [b, ...]} answers in row order, the padding rows dropped."""
    names = outputs[0].keys()
    merged = {name: torch.cat([out[name] for out in outputs], dim=0) for name in names}
    return {name: value[:size] for name, value in merged.items()}


def _in_place(outputs: list[dict], shards: list[TensorBatch], trained_only: bool) -> list[dict]:
    """The replicas' scoring answers on their shards' positions: unpacked from the trained
    positions the workers sent (trained_only), else as they came."""
    if not trained_only:
        return outputs
    return [unpacked(out, shard["token_mask"]) for out, shard in zip(outputs, shards, strict=True)]


def _trim(outputs: list, size: int) -> list:
    """Drop the padding rows that pad_batch_to_multiple appended (they sit at the end)."""
    flat_rows = 0
    trimmed = []
    for out in outputs:
        first = out[0] if isinstance(out, tuple) else out
        keep = max(0, min(first.shape[0], size - flat_rows))
        flat_rows += first.shape[0]
        trimmed.append(tuple(t[:keep] for t in out) if isinstance(out, tuple) else out[:keep])
    return trimmed
