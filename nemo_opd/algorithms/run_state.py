"""DistillationRun: everything a run holds, as setup() built it (algorithms/setup.py) and
distillation_train() drives it, and how it stops."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from nemo_opd.algorithms.prompts import PromptSet
from nemo_opd.config import DistillationConfig
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.prompt_loader import PromptLoader
from nemo_opd.distributed.cluster import release_placement
from nemo_opd.generation import VllmGeneration
from nemo_opd.losses import DistillationLossFn, NLLLossFn, PolicyGradientLossFn
from nemo_opd.losses.full_vocab_loss import FullVocabDistillationLossFn
from nemo_opd.policy.policy import Policy
from nemo_opd.rollouts import RolloutResult
from nemo_opd.teachers.base import Teacher
from nemo_opd.utils.checkpoint_manager import CheckpointManager
from nemo_opd.utils.logger import Logger
from nemo_opd.utils.run_dirs import RunLock

if TYPE_CHECKING:
    from ray.util.placement_group import PlacementGroup


@dataclass
class DistillationRun:
    """Everything setup() builds; distillation_train() drives it."""

    cfg: DistillationConfig
    formatter: ChatFormatter
    train_prompts: PromptSet
    val_prompts: PromptSet
    loader: PromptLoader
    environments: dict
    student: Policy
    teacher: Teacher | None
    generation: VllmGeneration
    loss_fn: DistillationLossFn | PolicyGradientLossFn | NLLLossFn
    val_loss_fn: DistillationLossFn | FullVocabDistillationLossFn | None
    logger: Logger
    checkpoints: CheckpointManager
    placement: PlacementGroup | None
    """The run's Ray placement group (None in one process: the local executor)."""
    lock: RunLock
    teacher_sampler: VllmGeneration | None = None
    """vLLM holding the teacher, sampling the off-policy steps' responses (seq_kd)."""
    step: int = 0
    generation_version: int = 0
    """The weights version the generation engine holds (the steps trained into them)."""
    resumed_step: int = 0
    """The step the run resumed from (0: a fresh run)."""
    stopped_by: int | None = None
    """The signal (SIGTERM, SIGINT) that stopped the run before its last step, if one did."""
    loader_position: dict | None = None
    """The loader's state after the last trained step's prompts (what a checkpoint records;
    the loader itself runs ahead with the rollout producer)."""
    saved_rollouts: dict[int, RolloutResult] = field(default_factory=dict)
    """The resumed checkpoint's rollouts of the steps after it (max_staleness > 0), by step."""
    last_metrics: dict = field(default_factory=dict)
    startup: dict = field(default_factory=dict)
    """{process: {mark: time.time()}} of the driver and every worker (nemo_opd.utils.startup);
    logged as timing/startup/* with the first metrics, then cleared."""
    started_at: float = field(default_factory=time.time)
    """time.time() when the driver process started (progress/elapsed_s counts from it)."""

    def shutdown(self) -> None:
        """Stop every worker, the environments and the placement group (under Ray), then close
        the logger and release the run's lock. Each is stopped even when one before it raises;
        the first error is raised after all of them, the others' noted on it.

        In one process, what setup froze (utils/gc_pause.py) is collected once at the end
        (_collect_frozen). The generation engines stop after the student and the teacher:
        vLLM's engine unfreezes the process's objects and collects them at its own shutdown
        (once: VllmWorker.stop defers its two collections to one), so stopped last, its
        collection frees the other parts' memory too, and every collection before it walks
        only the objects made since setup."""
        parts = [self.student, self.teacher, self.teacher_sampler, self.generation]
        stops = [part.shutdown for part in parts if part is not None]
        stops += [env.shutdown for env in self.environments.values()]
        if self.placement is not None:
            placement = self.placement
            stops.append(lambda: release_placement(placement))
        if self.logger is not None:
            stops.append(self.logger.close)
        stops.append(self.lock.release)
        stops.append(_collect_frozen)
        errors = []
        for stop in stops:
            try:
                stop()
            except Exception as error:  # noqa: BLE001 - raised below, after the rest stopped
                errors.append(error)
        if errors:
            for later in errors[1:]:
                errors[0].add_note(f"also while shutting down: {type(later).__name__}: {later}")
            raise errors[0]


def _collect_frozen() -> None:
    """What setup froze back to the collector, collected once (the stopped parts' memory held
    in reference cycles); nothing to do where the generation engine's shutdown did it."""
    if gc.get_freeze_count():
        gc.unfreeze()
        gc.collect()
