"""The weights a teacher that is the student itself scores with, held by the student's engine.

With teacher.source student, ema or lagged (docs/self_distillation.md) no teacher model is
loaded: the student's own engine scores the rollouts (the teacher's privileged rows) with

    student  its live weights, as they are;
    ema      an exponential moving average of them: after each training call (one loop step)
             ema <- decay x ema + (1 - decay) x weights, starting from the initial weights;
    lagged   a snapshot of them, taken again after every refresh_steps-th training call.

The average or snapshot is a copy of this rank's shard of every trainable parameter (fp32
like the master weights; a LoRA student's: its adapters only, the frozen base is shared), on
the student's device. To score with it, it is swapped into the parameters in place (an exact
exchange, parameter by parameter: one parameter's size of scratch memory), the ordinary no-grad
scoring runs (nothing of it reaches an optimizer or a gradient), and it is swapped back; so
every backend, layout and wrapper (FSDP, tensor parallel, LoRA, Megatron) scores it as it
scores the live weights.

With loss_fn.support full or student_topk the teacher sends hidden states and the student's
engine applies the teacher's LM head: after a teacher's scoring pass the engine keeps a
detached copy of the head rows that pass used (own_head), so that every optimizer step of the
loop step reads the head that made those hidden states.

Checkpoints: the average or snapshot is written into the policy checkpoint's `teacher/` folder
through the engine's own gather_weights / write_weights (a Hugging Face model folder, or a LoRA
adapter, fp32 and bit for bit), with teacher_state.json ({"source", "updates"}); load reads it
back through load_weights.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from nemo_opd.policy.engines.teacher_head import TeacherHead

# The functions below take the student's Engine (nemo_opd.policy.engines.base), which holds a
# SelfTeacherWeights as engine.self_teacher; the type is not imported, base imports this.
TEACHER_DIR = "teacher"
"""The self-teacher's weights inside a policy checkpoint."""
TEACHER_STATE_FILE = "teacher_state.json"
SOURCES = ("student", "ema", "lagged")


class SelfTeacherWeights:
    """The teacher's weights of one rank (see the module docstring).

    Args:
        source: "student", "ema" or "lagged".
        parameters: the engine's trainable parameters (the live ones: this rank's shards).
        decay: ema's decay per training call.
        refresh_steps: lagged's training calls between snapshots.
    """

    def __init__(
        self,
        source: str,
        parameters: list[torch.nn.Parameter],
        decay: float = 0.0,
        refresh_steps: int = 1,
    ) -> None:
        if source not in SOURCES:
            raise ValueError(f"unknown self-teacher source {source!r}; one of {SOURCES}")
        self.source = source
        self.decay = decay
        self.refresh_steps = refresh_steps
        self.updates = 0
        """Training calls averaged in (ema) or counted toward the next snapshot (lagged)."""
        self.parameters = list(parameters) if source != "student" else []
        self.copies = [tensor.clone() for tensor in self.live]
        """ema / lagged: this rank's shard of each trainable parameter, in its order."""

    @property
    def live(self) -> list[torch.Tensor]:
        """This rank's storage of each parameter, looked up at each use: FSDP2 may move a
        parameter's shard into a buffer of its own at its first forward."""
        return [_local(param) for param in self.parameters]

    @torch.no_grad()
    def after_training(self) -> None:
        """Fold one loop step's training into the teacher: ema averages the live weights in,
        lagged copies them every refresh_steps calls (student: nothing to do)."""
        self.updates += 1
        if self.source == "ema":
            for copy, live in zip(self.copies, self.live, strict=True):
                copy.lerp_(live, 1.0 - self.decay)
        elif self.source == "lagged" and self.updates % self.refresh_steps == 0:
            for copy, live in zip(self.copies, self.live, strict=True):
                copy.copy_(live)

    @contextmanager
    def swapped_in(self) -> Iterator[None]:
        """The teacher's weights in the parameters inside the block, the live ones outside it
        (exactly: swapped, never recomputed; restored also when the block raises)."""
        self._swap()
        try:
            yield
        finally:
            self._swap()

    @torch.no_grad()
    def _swap(self) -> None:
        for copy, live in zip(self.copies, self.live, strict=True):
            scratch = live.clone()
            live.copy_(copy)
            copy.copy_(scratch)

    def state(self) -> dict:
        """What teacher_state.json records."""
        return {"source": self.source, "updates": self.updates}


def hold_self_teacher(engine, source: str, decay: float, refresh_steps: int) -> None:
    """Give `engine` the self-teacher's weights, starting from its current ones (before a
    checkpoint is loaded: load() then restores them)."""
    parameters = [p for p in _model_parameters(engine) if p.requires_grad]
    engine.self_teacher = SelfTeacherWeights(source, parameters, decay, refresh_steps)


def score_as_teacher(engine, data, **need) -> dict[str, torch.Tensor]:
    """engine.score(data, **need) with the self-teacher's weights; with need["hidden"] the
    engine then holds the head rows of that pass as the teacher's LM head (own_head)."""
    teacher = engine.self_teacher
    if teacher is None:
        raise RuntimeError("score_as_teacher needs hold_self_teacher first (teacher.source)")
    with teacher.swapped_in():
        out = engine.score(data, **need)
        if need.get("hidden"):
            engine.teacher_head = own_head(engine)
        engine.set_train_mode(False)  # FSDP: drop the gathered teacher weights before the swap
    return out


def own_head(engine) -> TeacherHead:
    """A detached copy of the LM head rows (this rank's [V_pad / tp, H] in the compute
    precision) and bias ([V_pad / tp] or None) the engine's last forward used, with the
    model's own output head (its scale or soft-cap)."""
    weight = engine.output_weight().detach().clone()
    bias = engine.output_bias()
    bias = bias.detach().clone() if bias is not None else None
    return TeacherHead(weight, bias, engine.output_head)


def gather_self_teacher(engine) -> dict[str, torch.Tensor] | None:
    """The average or snapshot in gather_weights' format (a collective: every rank calls it;
    rank 0's result is written); None when there is nothing to save (no self-teacher, or the
    live student)."""
    teacher = engine.self_teacher
    if teacher is None or not teacher.copies:
        return None
    with teacher.swapped_in():
        weights = engine.gather_weights()
        # A shard that is the whole tensor may come back as the parameter itself (FSDP over
        # one rank on the CPU: nothing to gather or to move), which the swap back would
        # overwrite: keep a copy of those.
        held = {tensor.untyped_storage().data_ptr() for tensor in teacher.live}
        return {
            name: tensor.clone() if tensor.untyped_storage().data_ptr() in held else tensor
            for name, tensor in weights.items()
        }


def write_self_teacher(engine, root: Path, weights: dict[str, torch.Tensor]) -> None:
    """Rank 0: gather_self_teacher's weights and state into root/TEACHER_DIR."""
    folder = root / TEACHER_DIR
    folder.mkdir()
    engine.write_weights(folder, weights)
    (folder / TEACHER_STATE_FILE).write_text(json.dumps(engine.self_teacher.state()))


def load_self_teacher(engine, root: Path) -> None:
    """Restore the average or snapshot and its count from a checkpoint (every rank; nothing for
    the live student). ValueError when the checkpoint holds another source's or none."""
    teacher = engine.self_teacher
    if teacher is None or not teacher.copies:
        return
    state_file = root / TEACHER_DIR / TEACHER_STATE_FILE
    saved = json.loads(state_file.read_text()) if state_file.is_file() else {}
    if saved.get("source") != teacher.source:
        held = f"a teacher of source {saved['source']}" if saved else "no teacher weights"
        raise ValueError(
            f"{root} holds {held}, and this run's teacher.source is {teacher.source}: resume "
            "it with the source it was saved with, or start in another checkpoint_dir"
        )
    with teacher.swapped_in():  # the copies take the live weights; the file fills the model
        engine.load_weights(root / TEACHER_DIR)
    teacher.updates = int(saved["updates"])


def _model_parameters(engine) -> list[torch.nn.Parameter]:
    return list(engine.model.parameters())


def _local(param: torch.Tensor) -> torch.Tensor:
    """This rank's storage of a (DTensor) parameter, writable in place (no autograd)."""
    return (param.to_local() if isinstance(param, DTensor) else param).detach()
