"""Engine: training, evaluation and scoring, written once for every backend.

The base class owns everything that does not depend on how the model is parallelized:
microbatching (fixed size, dynamic by token budget, or sequence packing: microbatches.py), one
microbatch loop for training and evaluation, splitting rows over context-parallel ranks,
temperature, global valid-token loss normalization, metric aggregation, the padded
vocabulary's logit mask (vocab_padding.py), scoring (teacher_scores.py) and the checkpoint
outline (save: gather weights, optimizer, scheduler and RNG states -> rank 0 writes atomically
-> barrier; load: weights -> training state -> RNG -> step -> barrier). A backend
(DTensorEngine, MegatronEngine) implements only the primitives marked abstract below.

Conventions (see docs/policy.md):
- Data arrive as this data-parallel rank's shard (a TensorBatch); every tp/cp rank of the same
  dp coordinate gets the same shard.
- Position t's logits predict token t + 1. get_logprobs returns at position t the log-prob of
  token t + 1, and 0 at positions t >= input_lengths - 1 (no next token).
- Context parallelism: each cp rank computes positions [r * S / cp, (r + 1) * S / cp) of
  every (padded or packed) row; per-position outputs are all-gathered over cp.
- Tensor parallelism: the model holds padded_vocab_size rows, V_pad / tp per rank; logit
  columns of ids >= vocab_size are -inf, and every output has the real vocabulary.
"""

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoConfig

from nemo_opd.config import PolicyConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.collectives import all_reduce
from nemo_opd.distributed.context_parallel import AttentionLayout
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.distributed.vocab_parallel import vocab_parallel_logprobs, vocab_parallel_topk
from nemo_opd.losses import build_loss_mask, validate_teacher_topk
from nemo_opd.losses.chunked_head import chunked_head_loss, chunked_scores
from nemo_opd.losses.reduction import accumulate_metrics, reduce_over_ranks
from nemo_opd.losses.teacher_logits import TeacherLogits
from nemo_opd.models.output_head import output_head_of
from nemo_opd.policy.engines.microbatches import (
    Microbatch,
    dummy_like,
    scatter,
    split_rows,
    token_budget,
)
from nemo_opd.policy.engines.self_teacher_weights import (
    SelfTeacherWeights,
    gather_self_teacher,
    load_self_teacher,
    write_self_teacher,
)
from nemo_opd.policy.engines.teacher_head import TeacherHead, load_teacher_head
from nemo_opd.policy.engines.teacher_scores import score_positions
from nemo_opd.policy.engines.training_state import (
    DTYPES,
    gather_rng_states,
    read_step,
    read_training_state,
    restore_rng,
    write_training_state,
    write_weights,
)
from nemo_opd.policy.engines.vocab_padding import mask_padded_logits, padded_vocab_size
from nemo_opd.tiny import resolve_pretrained
from nemo_opd.utils.checkpoint import atomic_directory

LossFn = Callable[..., tuple[torch.Tensor, dict[str, torch.Tensor]]]
"""A loss function: loss_fn(logits, fields, global_valid_toks, vocab_start=, tp_group=) ->
(loss, metrics), with an `input_fields` attribute naming the per-position fields it reads
(DistillationLossFn, PolicyGradientLossFn)."""
TEACHER_HIDDEN = "teacher_hidden"
"""The teacher's final hidden states [B, S, H_T]: a loss field the engine turns into
TEACHER_LOGITS with the teacher's LM head, chunk by chunk (load_teacher_head)."""
TEACHER_LOGITS = "teacher_logits"
DERIVED_FIELDS = ("loss_mask", "targets")
"""Fields the engine makes itself: the aligned loss mask, and targets[:, t] = input_ids[:, t + 1]
(the token position t predicts)."""


class Engine(ABC):
    """One rank's training/scoring engine.

    Args:
        cfg: the model section (policy or teacher).
        dims: parallel sizes; its meshes must be built before the engine uses collectives.
        device: this rank's device.
        with_optimizer: build an optimizer and scheduler (False for a frozen teacher).
    """

    def __init__(
        self,
        cfg: PolicyConfig,
        dims: ParallelDims,
        device: torch.device,
        with_optimizer: bool = True,
    ) -> None:
        self.cfg = cfg
        self.dims = dims
        self.device = device
        self.with_optimizer = with_optimizer
        self.step = 0  # optimizer steps taken
        self.model_dir = resolve_pretrained(cfg.model_name)
        self.hf_config = AutoConfig.from_pretrained(self.model_dir)
        self.output_head = output_head_of(self.hf_config)  # refuses a head it cannot reproduce
        self.optimizer: torch.optim.Optimizer | None = None  # set by the backend when training
        self.scheduler: torch.optim.lr_scheduler.LRScheduler | None = None
        self.teacher_head: TeacherHead | None = None  # load_teacher_head (support full)
        self.self_teacher: SelfTeacherWeights | None = None  # teacher.source student/ema/lagged

    # ---------------------------------------------------------------- primitives (backends)

    @abstractmethod
    def forward_logits(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        """Logits of this rank's local positions and vocab shard, [b, s_local, V_pad / tp]
        (padding columns included: the base masks them).

        Runs with autograd when grad mode is on (training) and without otherwise.
        """

    @abstractmethod
    def forward_hidden(
        self, input_ids: torch.Tensor, position_ids: torch.Tensor, layout: AttentionLayout
    ) -> torch.Tensor:
        """The final hidden states (after the last norm, what the LM head reads) of this
        rank's local positions, [b, s_local, H], replicated over tp. Like forward_logits, with
        autograd when grad mode is on; the LM head is left to the caller (output_weight)."""

    @abstractmethod
    def output_weight(self) -> torch.Tensor:
        """This rank's rows of the LM head, [V_pad / tp, H], as the last forward_hidden used
        them (its gradient reaches the parameter): the chunked LM head multiplies them."""

    def output_bias(self) -> torch.Tensor | None:
        """This rank's entries of the LM head's bias, [V_pad / tp], like output_weight; None
        for a head without one (every head but a biased family's: output_head.biased)."""
        return None

    def backward(self, loss: torch.Tensor) -> None:
        """Accumulate the gradients of `loss` (already globally normalized)."""
        loss.backward()

    @abstractmethod
    def zero_grad(self) -> None:
        """Clear accumulated gradients."""

    @abstractmethod
    def apply_gradients(self) -> float:
        """Complete this rank's accumulated gradients (the reductions the backend leaves to
        the engine), clip them to a global norm of cfg.max_grad_norm (None: no clipping) and
        step the optimizer; returns the global norm before clipping."""

    @abstractmethod
    def set_train_mode(self, train: bool) -> None:
        """Switch the model between train and eval mode."""

    @abstractmethod
    def offload(self) -> None:
        """Move weights (and optimizer state) to host memory."""

    @abstractmethod
    def onload(self) -> None:
        """Move weights (and optimizer state) back to the device."""

    @abstractmethod
    def iter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(Hugging Face name, full tensor in Hugging Face's shape: the real vocabulary's rows)
        of every weight, lm_head included when tied.

        A collective: every rank must iterate to the end.
        """

    @abstractmethod
    def gather_weights(self) -> dict[str, torch.Tensor]:
        """{Hugging Face name: full fp32 CPU tensor in Hugging Face's shape} of every weight,
        lm_head omitted when tied (as Hugging Face saves it). A collective; only rank 0's
        result is used."""

    @abstractmethod
    def gather_optimizer_state(self) -> dict:
        """The torch optimizer's full state dict keyed by Hugging Face parameter name
        ({"state": {name: {...}}, "param_groups": [{..., "params": [names]}]}), moments as
        full CPU tensors of the weights' shapes. A collective; only rank 0's result is used."""

    @abstractmethod
    def load_weights(self, root: Path) -> None:
        """Load this rank's share of the Hugging Face safetensors weights in `root` (padding
        the vocabulary rows)."""

    @abstractmethod
    def load_optimizer_state(self, state: dict) -> None:
        """Load this rank's share of a state dict in gather_optimizer_state's format (padding
        the vocabulary rows)."""

    # ---------------------------------------------------------------- shared by every backend

    def optimizer_step(self) -> dict[str, float]:
        """Apply the gradients and step the schedule (the backend's `scheduler`, over the
        torch optimizer `optimizer`); returns {"grad_norm": ..., "lr": ...}."""
        if self.optimizer is None:
            raise RuntimeError("this engine was built without an optimizer (a frozen teacher)")
        lr = self.optimizer.param_groups[0]["lr"]
        grad_norm = self.apply_gradients()
        self.scheduler.step()
        self.step += 1
        return {"grad_norm": float(grad_norm), "lr": float(lr)}

    @property
    def scores_shared_prefixes(self) -> bool:
        """Whether Engine.score runs the prefixes rows share once (shared_prefix.py): an
        engine whose attention reads the layout's contexts says so where its config asks."""
        return False

    @property
    def vocab_size(self) -> int:
        """The model's full (global) vocabulary size."""
        return self.hf_config.vocab_size

    @property
    def padded_vocab_size(self) -> int:
        """Rows of the model's embedding and output layer (vocab_padding.py)."""
        return padded_vocab_size(
            self.vocab_size, self.dims.tp, self.cfg.make_vocab_size_divisible_by
        )

    @property
    def vocab_start(self) -> int:
        """Global id of this rank's first logit column."""
        return self.padded_vocab_size // self.dims.tp * self.dims.local_rank("tp")

    def save(self, path: str) -> None:
        """Write a checkpoint directory atomically (a collective: every rank takes part in the
        gathers, rank 0 writes; the layout is training_state.py's)."""
        weights = self.gather_weights()
        optimizer = self.gather_optimizer_state() if self.optimizer is not None else None
        scheduler = self.scheduler.state_dict() if self.scheduler is not None else None
        rng = gather_rng_states()
        teacher = gather_self_teacher(self)
        if dist.get_rank() == 0:
            with atomic_directory(path) as tmp:
                self.write_weights(tmp, weights)
                write_training_state(tmp, optimizer, scheduler, rng, self.step)
                if teacher is not None:
                    write_self_teacher(self, tmp, teacher)
        dist.barrier()

    def write_weights(self, tmp: Path, weights: dict[str, torch.Tensor]) -> None:
        """Write gather_weights()'s result into a checkpoint directory (rank 0 only)."""
        write_weights(tmp, weights, self.hf_config.to_dict())

    def export(self, path: str, dtype: str = "float32") -> None:
        """Write the trained model for use outside the run, atomically: Hugging Face weights in
        `dtype` (the policy's precision) and config.json, loadable with from_pretrained and
        vLLM; no training state (that is the checkpoint's). A collective."""
        weights = self.gather_weights()
        if dist.get_rank() == 0:
            with atomic_directory(path) as tmp:
                write_weights(tmp, weights, self.hf_config.to_dict(), dtype)
        dist.barrier()

    def load(self, path: str) -> None:
        """Restore weights, optimizer, scheduler, RNG and step from a checkpoint directory (the
        RNG states only when the world size is the same)."""
        root = Path(path)
        self.load_weights(root)
        state = read_training_state(root)
        if state is not None:
            if self.optimizer is not None and state["optimizer"] is not None:
                self.load_optimizer_state(state["optimizer"])
                self.scheduler.load_state_dict(state["scheduler"])
            restore_rng(state["rng"])
        self.step = read_step(root, self.step)
        load_self_teacher(self, root)
        dist.barrier()

    # ---------------------------------------------------------------- process groups

    @property
    def dp_group(self) -> dist.ProcessGroup:
        """Data-parallel group (ranks holding different data)."""
        return self.dims.group("dp")

    @property
    def tp_group(self) -> dist.ProcessGroup:
        """Tensor-parallel group (vocab shards of the logits)."""
        return self.dims.group("tp")

    @property
    def cp_group(self) -> dist.ProcessGroup:
        """Context-parallel group (sequence shards)."""
        return self.dims.group("cp")

    @property
    def dp_cp_group(self) -> dist.ProcessGroup:
        """Ranks whose per-token sums add up to the global batch's."""
        return self.dims.group("dp_cp")

    def _tp_shards(self) -> dist.ProcessGroup | None:
        """The tp group for a loss when the vocabulary is sharded, else None (no collectives)."""
        return self.tp_group if self.dims.tp > 1 else None

    # ---------------------------------------------------------------- shared algorithms

    def train(self, data: TensorBatch, loss_fn: LossFn, global_batch_size: int) -> dict:
        """One optimizer step per global batch of this rank's shard.

        Args:
            data: this dp rank's rows: input_ids, input_lengths, token_mask, sample_mask, and
                the per-position fields loss_fn.input_fields names (e.g. the teacher's top-k,
                or old log-probs and advantages); a multiple of global_batch_size / dp rows, in
                step order.
            loss_fn: called as loss_fn(logits, fields, global_valid_toks, vocab_start=,
                tp_group=) with fields holding its input_fields (loss_mask and targets made
                here), returning (loss, metrics); see DistillationLossFn.
            global_batch_size: rows per optimizer step across all dp ranks.

        Returns:
            {name: [one value per step]}: the loss function's metrics summed over microbatches
            and dp/cp ranks (those named *_min / *_max: their min / max), plus
            global_valid_toks, grad_norm and lr.
        """
        local_rows = global_batch_size // self.dims.dp
        if data.size % local_rows:
            raise ValueError(f"{data.size} local rows is not a multiple of {local_rows}")
        data = self._loss_inputs(data, loss_fn.input_fields)
        history: dict[str, list[float]] = {}
        self.set_train_mode(True)
        for step_data in data.chunk(local_rows):
            self.zero_grad()
            metrics = self._loss_pass(step_data, loss_fn, train=True)
            metrics.update(self.optimizer_step())
            for name, value in metrics.items():
                history.setdefault(name, []).append(value)
        if self.self_teacher is not None:  # one call is one loop step's training
            self.self_teacher.after_training()
        return history

    @torch.no_grad()
    def evaluate(self, data: TensorBatch, loss_fn: LossFn) -> dict[str, float]:
        """The loss function's metrics over all of this rank's rows, without a gradient step
        (e.g. the validation KL). Same inputs as train; any number of rows; normalized by the
        valid tokens of the whole call across dp ranks."""
        data = self._loss_inputs(data, loss_fn.input_fields)
        self.set_train_mode(False)
        return self._loss_pass(data, loss_fn, train=False)

    def _loss_inputs(self, data: TensorBatch, fields: tuple[str, ...]) -> TensorBatch:
        """`data` on the device with its loss_mask (and targets when `fields` name them); the
        fields the loss reads must be there, and the teacher's top-k is checked where the mask
        grades (once per call: one host sync), so a malformed teacher fails here, naming the
        problem, instead of turning the loss or a metric into NaN."""
        data = data.to(self.device)
        data["loss_mask"] = build_loss_mask(data["token_mask"], data.get("sample_mask"))
        if "targets" in fields:
            data["targets"] = torch.roll(data["input_ids"], -1, dims=1)
        missing = [name for name in fields if name not in data]
        if missing:
            raise ValueError(f"the loss reads {missing}, which the batch does not hold")
        if "teacher_topk_logprobs" in fields:
            validate_teacher_topk(
                data["teacher_topk_logprobs"],
                data["teacher_topk_indices"],
                self.vocab_size,
                mask=data["loss_mask"],
            )
        return data

    def _loss_pass(self, data: TensorBatch, loss_fn: LossFn, train: bool) -> dict[str, float]:
        """Run loss_fn on every microbatch of `data` (with train: the training microbatches,
        and backward after each), every loss normalized by the valid positions of `data` on
        all dp ranks.

        Returns:
            the loss function's metrics summed over microbatches and dp/cp ranks (*_min /
            *_max: reduced by min / max), and global_valid_toks.
        """
        valid = data["loss_mask"].sum().reshape(1)
        all_reduce(valid, self.dp_group)
        make = self._train_microbatches if train else self._scoring_microbatches
        names = loss_fn.input_fields
        sums: dict[str, torch.Tensor] = {}

        def loss_of_logits(logits: torch.Tensor, fields: dict) -> tuple[torch.Tensor, dict]:
            count = valid[0].clamp(min=1)
            if TEACHER_HIDDEN in fields:
                fields = self._with_teacher_logits(fields)
            return loss_fn(
                logits, fields, count, vocab_start=self.vocab_start, tp_group=self._tp_shards()
            )

        for mb in make(data, names):
            fields = {key: self._cp_shard(mb.fields[key]) for key in names}
            loss, metrics = self._microbatch_loss(mb, fields, loss_of_logits)
            if train:
                self.backward(loss)
            accumulate_metrics(sums, metrics)  # dummies too: every rank reduces the same names
        metrics = reduce_over_ranks(sums, self.dp_cp_group, self.device)
        metrics["global_valid_toks"] = float(valid[0])
        return metrics

    def _microbatch_loss(
        self, mb: Microbatch, fields: dict, loss_of_logits: Callable
    ) -> tuple[torch.Tensor, dict]:
        """One microbatch's loss: on its whole logits, or with policy.logits_chunk_tokens the
        LM head and the loss together over chunks of positions (losses.chunked_head)."""
        chunk = self.cfg.logits_chunk_tokens
        if chunk is None:
            return loss_of_logits(self._forward(mb), fields)
        return chunked_head_loss(
            self._forward_hidden(mb),
            self.output_weight(),
            fields,
            loss_of_logits,
            chunk=chunk,
            project=self._project,
            finish=self._finish,
            bias=self.output_bias(),
            tp_group=self._tp_shards(),
            keep=fields["loss_mask"] != 0 if "loss_mask" in fields else None,
        )

    @torch.no_grad()
    def get_logprobs(self, data: TensorBatch, temperature: float = 1.0) -> torch.Tensor:
        """[B, S] fp32: position t holds log p(token t + 1 | tokens <= t) at the temperature;
        0 where t >= input_lengths - 1."""
        data = data.to(self.device)
        data["targets"] = torch.roll(data["input_ids"], -1, dims=1)
        out = torch.zeros(data["input_ids"].shape, dtype=torch.float32, device=self.device)
        self.set_train_mode(False)
        for mb in self._scoring_microbatches(data, ("targets",)):
            targets = self._cp_shard(mb.fields["targets"]).reshape(-1)

            def logprobs(logits, start, end, targets=targets):
                target = targets[start:end]
                return (vocab_parallel_logprobs(logits / temperature, target, *self._vocab()),)

            (values,) = self._per_position(mb, logprobs, (((), torch.float32),))
            scatter(self._cp_gather(values), mb, out)
        positions = torch.arange(out.shape[1], device=self.device)
        return torch.where(positions < data["input_lengths"].unsqueeze(1) - 1, out, 0.0).cpu()

    @torch.no_grad()
    def get_topk_logits(
        self, data: TensorBatch, k: int, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k log-probs over the full vocabulary at the temperature, per position.

        Returns:
            (log-probs [B, S, k] fp32 descending, global ids [B, S, k] int32); positions at or
            beyond input_lengths are 0.
        """
        if k > self.vocab_size:
            raise ValueError(f"k={k} exceeds the vocabulary size {self.vocab_size}")
        data = data.to(self.device)
        shape = (*data["input_ids"].shape, k)
        values_out = torch.zeros(shape, dtype=torch.float32, device=self.device)
        indices_out = torch.zeros(shape, dtype=torch.int32, device=self.device)
        self.set_train_mode(False)
        for mb in self._scoring_microbatches(data, ()):

            def topk(logits, start, end):
                return vocab_parallel_topk(logits / temperature, k, *self._vocab())

            outputs = (((k,), torch.float32), ((k,), torch.int32))
            values, indices = self._per_position(mb, topk, outputs)
            scatter(self._cp_gather(values), mb, values_out)
            scatter(self._cp_gather(indices), mb, indices_out)
        # A padded microbatch also scored its padding: zero it, as documented.
        positions = torch.arange(shape[1], device=self.device)
        real = (positions < data["input_lengths"].unsqueeze(1)).unsqueeze(-1)
        return (values_out * real).cpu(), (indices_out * real).cpu()

    def get_hidden_states(self, data: TensorBatch) -> torch.Tensor:
        """The final hidden states (after the last norm: what the LM head reads) of every
        position, [B, S, H] in the engine's compute precision; positions at or beyond
        input_lengths are 0. What a teacher sends for the full-vocabulary divergence."""
        return self.score(data, hidden=True)["hidden_states"]

    def score(
        self,
        data: TensorBatch,
        *,
        topk: int = 0,
        temperature: float = 1.0,
        logprobs: bool = False,
        hidden: bool = False,
        trained_only: bool = False,
    ) -> dict[str, torch.Tensor]:
        """Any of the top-k, the next-token log-probs and the hidden states of every position
        (the top-k and log-probs with trained_only: of the token mask's positions only, 0
        elsewhere) in one forward pass per microbatch (teacher_scores.score_positions)."""
        return score_positions(
            self,
            data,
            topk=topk,
            temperature=temperature,
            logprobs=logprobs,
            hidden=hidden,
            trained_only=trained_only,
        )

    def load_teacher_head(self, model_dir: str, precision: str) -> None:
        """Hold this rank's rows of the teacher's LM head (frozen, in `precision`), with which
        the training and evaluation loss turn the teacher's hidden states into its logits
        (loss_fn.support full or student_topk; teacher_head.py)."""
        self.teacher_head = load_teacher_head(
            resolve_pretrained(model_dir),
            self.vocab_size,
            self.padded_vocab_size,
            self.dims.tp,
            self.dims.local_rank("tp"),
            self.device,
            DTYPES[precision],
        )

    def _with_teacher_logits(self, fields: dict) -> dict:
        """A chunk's (or microbatch's) fields with the teacher's hidden states [..., H_T]
        replaced by its logits [..., V_pad / tp] over this rank's columns, padding at -inf,
        made a slab of rows at a time as the loss reaches them (TeacherLogits: one product of
        the head per chunk of 256 positions at Qwen3's vocabulary)."""
        if self.teacher_head is None:
            raise RuntimeError(
                "the loss reads the teacher's hidden states, but this engine holds no teacher "
                "LM head: call load_teacher_head first"
            )
        fields = dict(fields)
        hidden = fields.pop(TEACHER_HIDDEN)
        head = self.teacher_head

        def logits(rows: torch.Tensor) -> torch.Tensor:
            return self._mask_padding(head.logits(rows))

        local = head.weight.shape[0]
        fields[TEACHER_LOGITS] = TeacherLogits.from_hidden(hidden, logits, local)
        return fields

    # ---------------------------------------------------------------- microbatching

    def _train_microbatches(self, data: TensorBatch, fields: tuple[str, ...]) -> list:
        budget = token_budget(self.cfg, train=True)
        return self._microbatches(data, fields, budget, self.cfg.train_micro_batch_size)

    def _scoring_microbatches(self, data: TensorBatch, fields: tuple[str, ...]) -> list:
        budget = token_budget(self.cfg, train=False)
        return self._microbatches(data, fields, budget, self.cfg.logprob_batch_size)

    def _sequence_multiple(self) -> int:
        """Row lengths are padded to a multiple of this (context parallel needs cp | S)."""
        return math.lcm(self.cfg.make_sequence_length_divisible_by, self.dims.cp)

    def _microbatches(
        self,
        data: TensorBatch,
        field_names: tuple[str, ...],
        budget: int | None,
        rows_per_microbatch: int,
    ) -> list[Microbatch]:
        """Split this rank's rows into microbatches (packed, dynamic or fixed-size:
        microbatches.py), as many as the busiest dp rank's."""
        multiple = self._sequence_multiple()
        mbs = split_rows(data, field_names, self.cfg, budget, rows_per_microbatch, multiple)
        return self._equalize_count(mbs)

    def _equalize_count(self, microbatches: list[Microbatch]) -> list[Microbatch]:
        """Append dummy microbatches until every dp rank runs as many as the busiest one.

        FSDP gathers parameters in every forward, so all dp ranks must run the same number.
        """
        template, busiest = microbatches[0], self._busiest_count(len(microbatches))
        while len(microbatches) < busiest:  # one collective, then the same count everywhere
            microbatches.append(dummy_like(template))
        return microbatches

    def _busiest_count(self, count: int) -> int:
        """The most microbatches any dp rank runs (a collective over the dp group)."""
        most = torch.tensor([count], device=self.device)
        all_reduce(most, self.dp_group, dist.ReduceOp.MAX)
        return int(most)

    # ---------------------------------------------------------------- context parallel

    def _cp_shard(self, tensor: torch.Tensor) -> torch.Tensor:
        """This cp rank's contiguous slice of dim 1 of [b, s, ...]."""
        if self.dims.cp == 1:
            return tensor
        return tensor.chunk(self.dims.cp, dim=1)[self.dims.local_rank("cp")]

    def _cp_gather(self, tensor: torch.Tensor) -> torch.Tensor:
        """[b, s_local, ...] -> [b, s, ...] over the cp group (no autograd)."""
        if self.dims.cp == 1:
            return tensor
        parts = [torch.empty_like(tensor) for _ in range(self.dims.cp)]
        dist.all_gather(parts, tensor.contiguous(), group=self.cp_group)
        return torch.cat(parts, dim=1)

    def _forward(self, mb: Microbatch) -> torch.Tensor:
        """Logits [b, s_local, V_local] of this rank's share of a microbatch, padded vocabulary
        columns at -inf."""
        logits = self.forward_logits(*self._local_inputs(mb))
        return mask_padded_logits(logits, self.vocab_start, self.vocab_size)

    def _forward_hidden(self, mb: Microbatch) -> torch.Tensor:
        """Final hidden states [b, s_local, H] of this rank's share of a microbatch."""
        return self.forward_hidden(*self._local_inputs(mb))

    def _local_inputs(self, mb: Microbatch) -> tuple[torch.Tensor, torch.Tensor, AttentionLayout]:
        """(input_ids, position_ids, layout) of this rank's context-parallel share."""
        q_start = mb.input_ids.shape[1] // self.dims.cp * self.dims.local_rank("cp")
        layout = AttentionLayout(
            segment_ids=mb.segment_ids,
            q_start=q_start,
            cp_group=self.cp_group if self.dims.cp > 1 else None,
            contexts=mb.contexts,
        )
        return self._cp_shard(mb.input_ids), self._cp_shard(mb.position_ids), layout

    def _vocab(self) -> tuple[int, dist.ProcessGroup]:
        """(vocab_start, tp_group): where this rank's logit columns sit in the vocabulary."""
        return self.vocab_start, self.tp_group

    def _project(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The linear part of the model's head (output_head.project): hidden states [n, H] x
        this rank's rows [V_local, H] (+ bias) -> [n, V_local] in the compute precision."""
        return self.output_head.project(hidden, weight, bias)

    def _finish(self, raw: torch.Tensor) -> torch.Tensor:
        """The rest of the model's head (output_head.transform: its scale or soft-cap), then
        the padded vocabulary's columns at -inf: _project's raw product -> logits."""
        return self._mask_padding(self.output_head.transform(raw))

    def _mask_padding(self, logits: torch.Tensor) -> torch.Tensor:
        """The padded vocabulary's columns of this rank's logits at -inf."""
        return mask_padded_logits(logits, self.vocab_start, self.vocab_size)

    def _per_position(
        self,
        mb: Microbatch,
        score: Callable[[torch.Tensor, int, int], tuple[torch.Tensor, ...]],
        outputs: tuple[tuple[tuple[int, ...], torch.dtype], ...],
    ) -> tuple[torch.Tensor, ...]:
        """score(logits [n, V_local], start, end) -> one [n, *shape] tensor per (shape, dtype)
        of `outputs`, for every position of this rank's share of a microbatch (flattened
        [b * s_local]); returned as [b, s_local, *shape] each. From the whole logits, or with
        policy.logits_chunk_tokens from one chunk of them at a time (the LM head applied per
        chunk: [b * s_local, V] never exists)."""
        chunk = self.cfg.logits_chunk_tokens
        if chunk is None:
            logits = self._forward(mb)
            b, s = logits.shape[:2]
            scored = score(logits.reshape(b * s, -1), 0, b * s)
            return tuple(
                t.reshape(b, s, *shape) for t, (shape, _) in zip(scored, outputs, strict=True)
            )
        hidden = self._forward_hidden(mb)
        b, s = hidden.shape[:2]
        out = [
            torch.empty((b * s, *shape), dtype=dtype, device=hidden.device)
            for shape, dtype in outputs
        ]

        def keep(logits: torch.Tensor, start: int, end: int) -> None:
            for target, values in zip(out, score(logits, start, end), strict=True):
                target[start:end] = values

        chunked_scores(
            hidden,
            self.output_weight(),
            keep,
            chunk=chunk,
            project=self._project,
            finish=self._finish,
            bias=self.output_bias(),
        )
        return tuple(t.reshape(b, s, *shape) for t, (shape, _) in zip(out, outputs, strict=True))
