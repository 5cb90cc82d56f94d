"""PolicyWorker: one rank's engine, as a Ray actor or as an object in the driver's process
(nemo_opd.distributed.worker_group)."""

import os
from collections.abc import Callable

import torch

from nemo_opd.config import PolicyConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.distributed.parallel_dims import ParallelDims
from nemo_opd.distributed.process_group import (
    find_free_port,
    init_distributed,
    init_local_process_group,
    node_address,
)
from nemo_opd.policy.engines.self_teacher_weights import hold_self_teacher, score_as_teacher
from nemo_opd.policy.trained_positions import packed
from nemo_opd.scoring.base import TeacherNeed, TeacherScores
from nemo_opd.scoring.rendering import TeacherRendering, score_rendered
from nemo_opd.utils.startup import StartupMarks


class PolicyWorker:
    """One rank of a Policy: joins the process group, builds the engine, serves calls.

    Args:
        rank: global rank in the worker group.
        cfg: the model section as a plain dict (validated again here).
        dims: parallel sizes.
        device_type: "cpu" or "cuda".
        num_threads: torch intra-op threads (the CPUs reserved for this worker; in the
            driver's process, the process's count, which every model there sets alike).
        with_optimizer: False for a frozen teacher.
        total_steps: the run's optimizer steps (decaying schedules).
    """

    def __init__(
        self,
        rank: int,
        cfg: dict,
        dims: ParallelDims,
        device_type: str,
        num_threads: int,
        with_optimizer: bool,
        total_steps: int | None,
    ) -> None:
        self.startup = StartupMarks()
        self.rank = rank
        self.cfg = PolicyConfig.model_validate(cfg)
        self.dims = dims
        self.device_type = device_type
        self.with_optimizer = with_optimizer
        self.total_steps = total_steps
        self.engine = None
        self.rendering: TeacherRendering | None = None  # a teacher with another tokenizer
        torch.set_num_threads(num_threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

    def master_address(self) -> tuple[str, int]:
        """Where rank 0 listens for the rendezvous."""
        return node_address(), find_free_port()

    def init_distributed(self, address: tuple[str, int] | None) -> None:
        """Join the process group at rank 0's (addr, port), or with None the process's one-rank
        group (the only rank, in the driver's process), then build the meshes and the engine."""
        if address is None:
            init_local_process_group(self.device_type)
        else:
            addr, port = address
            init_distributed(self.rank, self.dims.world_size, addr, port, self.device_type)
        self.dims.build_mesh()
        self.startup.note("process_group")
        device = (
            torch.device("cuda", torch.cuda.current_device())
            if self.device_type == "cuda"
            else torch.device("cpu")
        )
        self.engine = self._build_engine(device)
        self.startup.note("engine_ready")

    def startup_marks(self) -> dict[str, float]:
        """This worker's start-up times (nemo_opd.utils.startup)."""
        return self.startup.as_dict()

    def _build_engine(self, device: torch.device):
        if self.cfg.backend == "megatron":
            from nemo_opd.policy.engines.megatron import MegatronEngine

            return MegatronEngine(
                self.cfg, self.dims, device, self.with_optimizer, total_steps=self.total_steps
            )
        from nemo_opd.policy.engines.dtensor import DTensorEngine

        return DTensorEngine(
            self.cfg, self.dims, device, self.with_optimizer, total_steps=self.total_steps
        )

    def train(self, data: dict, loss_fn: Callable, global_batch_size: int) -> dict:
        return self.engine.train(TensorBatch(data), loss_fn, global_batch_size)

    def evaluate(self, data: dict, loss_fn: Callable) -> dict:
        return self.engine.evaluate(TensorBatch(data), loss_fn)

    def get_logprobs(self, data: dict, temperature: float) -> torch.Tensor:
        return self.engine.get_logprobs(TensorBatch(data), temperature)

    def get_topk_logits(self, data: dict, k: int, temperature: float) -> tuple:
        return self.engine.get_topk_logits(TensorBatch(data), k, temperature)

    def get_hidden_states(self, data: dict) -> torch.Tensor:
        return self.engine.get_hidden_states(TensorBatch(data))

    def score(
        self,
        data: dict,
        topk: int,
        temperature: float,
        logprobs: bool,
        hidden: bool,
        trained_only: bool = False,
    ) -> dict | None:
        """Engine.score's answer as Policy.score reads it (_answer)."""
        out = self.engine.score(
            TensorBatch(data),
            topk=topk,
            temperature=temperature,
            logprobs=logprobs,
            hidden=hidden,
            trained_only=trained_only,
        )
        return self._answer(out, data, trained_only)

    def _answer(self, out: dict, data: dict, trained_only: bool) -> dict | None:
        """What crosses to the driver of a scoring answer: nothing from the ranks whose
        answers it does not read (answers_for_its_replica), and with trained_only the trained
        positions' values only (trained_positions.packed; Policy unpacks them)."""
        if not answers_for_its_replica(self.dims, self.rank):
            return None
        return packed(out, data["token_mask"]) if trained_only else out

    def set_rendering(self, rendering: TeacherRendering) -> None:
        """How the student's conversations read in this model's tokens (score_rendered)."""
        self.rendering = rendering

    def score_rendered(
        self, shard: tuple[dict, list], topk: int, temperature: float, logprobs: bool
    ) -> dict | None:
        """score() of the student's rows (shard: the student's rows and their conversations)
        through this model's own tokens (Policy.score_rendered): rendered, scored and moved
        onto the student's positions here. Every rank of the replica renders and scores (the
        forward is collective); only the rank that answers for it maps (None elsewhere)."""
        data, logs = shard
        need = TeacherNeed(topk=topk, sampled=logprobs, temperature=temperature)

        def score_rows(rows) -> TeacherScores:
            out = self.engine.score(
                TensorBatch(rows.batch), topk=topk, temperature=temperature, logprobs=logprobs
            )
            return TeacherScores(**out)

        if not answers_for_its_replica(self.dims, self.rank):
            score_rows(self.rendering.teacher_rows(logs))
            return None
        return score_rendered(self.rendering, TensorBatch(data), logs, need, score_rows)

    def load_teacher_head(self, model_dir: str, precision: str) -> None:
        self.engine.load_teacher_head(model_dir, precision)

    def hold_self_teacher(self, source: str, decay: float, refresh_steps: int) -> None:
        hold_self_teacher(self.engine, source, decay, refresh_steps)

    def score_as_teacher(self, data: dict, need: dict) -> dict | None:
        out = score_as_teacher(self.engine, TensorBatch(data), **need)
        return self._answer(out, data, need.get("trained_only", False))

    def save(self, path: str) -> None:
        self.engine.save(path)

    def export(self, path: str, dtype: str) -> None:
        self.engine.export(path, dtype)

    def load(self, path: str) -> None:
        self.engine.load(path)

    def offload(self) -> None:
        self.engine.offload()

    def onload(self) -> None:
        self.engine.onload()

    def full_weights(self) -> dict[str, torch.Tensor] | None:
        """Every weight in HF naming on rank 0 (None elsewhere); all ranks must be called."""
        weights = dict(self.engine.iter_weights())
        return weights if self.rank == 0 else None

    def module(self) -> torch.nn.Module:
        """The DTensor engine's transformers module (Policy.local_module); ValueError for the
        Megatron engine, whose model is not a transformers module."""
        if self.cfg.backend != "dtensor":
            raise ValueError(f"the {self.cfg.backend} engine holds no transformers module")
        return self.engine.model

    def step(self) -> int:
        """Optimizer steps taken."""
        return self.engine.step


def answers_for_its_replica(dims: ParallelDims, rank: int) -> bool:
    """The rank whose results the driver reads for its replica: cp = 0 and tp = 0."""
    where = dims.coordinates(rank)
    return where["cp"] == 0 and where["tp"] == 0
