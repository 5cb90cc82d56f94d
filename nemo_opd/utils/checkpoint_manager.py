"""Step checkpoints: atomic save, top-k pruning by a metric, and finding the one to resume.

Layout under CheckpointingConfig.checkpoint_dir:
    step_<N>/                  one complete checkpoint
        training_state.json    {"step": N, "metrics": {...}, "state": {...}}
        ...                    whatever the caller's write_fn wrote (policy weights, optimizer)

Crash-safety protocol (one writer, the driver process):
 1. save() builds the whole checkpoint in a hidden temporary sibling `.step_<N>.tmp-*`:
    write_fn writes into it, then training_state.json is written last.
 2. The tree is fsynced and renamed to `step_<N>` with os.replace (atomic on POSIX), so a
    `step_<N>` directory is always complete. Overwriting an existing `step_<N>` moves the old
    one to `step_<N>.previous` first and deletes it only after the rename; see
    nemo_opd.utils.checkpoint.atomic_directory.
 3. Pruning renames a doomed `step_<M>` to a hidden `.step_<M>.deleting-*` (atomic) before
    removing its files, so a crash mid-delete never leaves a partial `step_<M>`.
 4. latest() puts back a `step_<N>.previous` whose replacement never landed, removes leftover
    temporaries, and returns the highest `step_<N>` that holds training_state.json.
A crash at any point therefore leaves every earlier checkpoint intact, and latest() returns
the last one that completed.
"""

import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from nemo_opd.config import CheckpointingConfig
from nemo_opd.utils.checkpoint import BACKUP_SUFFIX, atomic_directory, recover_checkpoint

STATE_FILE = "training_state.json"
_STEP_DIR = re.compile(r"step_(\d+)")
# Hidden leftovers of an interrupted save (atomic_directory) or prune (this module).
_STALE = re.compile(r"\.step_\d+\.(tmp|deleting)-.*")


class CheckpointManager:
    """Saves, ranks, prunes and finds step checkpoints (see the module docstring)."""

    def __init__(self, cfg: CheckpointingConfig) -> None:
        self.cfg = cfg
        self.root = Path(cfg.checkpoint_dir)

    def path_for(self, step: int) -> Path:
        """Directory of the checkpoint of `step`."""
        return self.root / f"step_{step}"

    def should_save(self, step: int, *, is_last: bool = False) -> bool:
        """Whether to checkpoint after `step`: every save_period steps and after the last."""
        return self.cfg.enabled and (step % self.cfg.save_period == 0 or is_last)

    def save(
        self,
        step: int,
        write_fn: Callable[[Path], None],
        state: Mapping[str, Any] | None = None,
        metrics: Mapping[str, Any] | None = None,
    ) -> Path:
        """Atomically write checkpoint `step`, then prune to keep_top_k; returns its path.

        write_fn(directory) writes the model/optimizer files into `directory` (a temporary
        directory that becomes step_<step>/). state: JSON-serialisable resume state (data
        loader position, ...); metrics: the step's metrics, used to rank checkpoints.
        If write_fn or serialisation raises, nothing of this save is left behind.
        """
        record = {
            "step": step,
            "metrics": {key: _json_number(value) for key, value in (metrics or {}).items()},
            "state": dict(state or {}),
        }
        with atomic_directory(self.path_for(step)) as tmp:
            write_fn(tmp)
            # Serialise before opening the file so a bad state fails without a partial file.
            text = json.dumps(record, indent=2, allow_nan=False)
            (tmp / STATE_FILE).write_text(text, encoding="utf-8")
        self.prune(keep=step)
        return self.path_for(step)

    def checkpoints(self) -> dict[int, Path]:
        """Complete checkpoints {step: path}, by increasing step."""
        if not self.root.is_dir():
            return {}
        found = {}
        for path in self.root.iterdir():
            match = _STEP_DIR.fullmatch(path.name)
            if match and (path / STATE_FILE).is_file():
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def latest(self) -> Path | None:
        """The highest-step complete checkpoint (after recovering from any crashed save), or
        None when there is none."""
        self.recover()
        found = self.checkpoints()
        return found[max(found)] if found else None

    def load_state(self, path: str | os.PathLike) -> dict[str, Any]:
        """The training_state.json of a checkpoint: {"step", "metrics", "state"}."""
        state_file = Path(path) / STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"{path} is not a complete checkpoint: no {STATE_FILE}")
        return json.loads(state_file.read_text(encoding="utf-8"))

    def recover(self) -> None:
        """Restore checkpoints a crashed overwrite moved aside; delete stale temporaries."""
        if not self.root.is_dir():
            return
        for path in list(self.root.iterdir()):
            if path.name.endswith(BACKUP_SUFFIX):
                original = path.name.removesuffix(BACKUP_SUFFIX)
                if _STEP_DIR.fullmatch(original):
                    recover_checkpoint(self.root / original)
            elif _STALE.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)

    def prune(self, keep: int | None = None) -> list[int]:
        """Delete checkpoints beyond keep_top_k; returns the deleted steps.

        Ranking: checkpoints that logged metric_name (a finite number) come first, best first
        (higher_is_better), ties to the newer; then those without it, newest first. The
        latest checkpoint (so resume works) and step `keep` (the one just saved) are always
        kept, on top of the top k. keep_top_k null keeps everything.
        """
        if self.cfg.keep_top_k is None:
            return []
        found = self.checkpoints()
        protected = {max(found, default=None), keep}
        ranked = sorted(found, key=lambda step: self._rank_key(found[step], step), reverse=True)
        kept = protected | set(ranked[: self.cfg.keep_top_k])
        removed = [step for step in found if step not in kept]
        for step in removed:
            _remove_atomically(found[step])
        return removed

    def _rank_key(self, path: Path, step: int) -> tuple[bool, float, int]:
        """Sort key, larger is better: (has the metric, signed metric, step)."""
        value = None
        if self.cfg.metric_name is not None:
            value = self.load_state(path).get("metrics", {}).get(self.cfg.metric_name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return (False, 0.0, step)
        return (True, value if self.cfg.higher_is_better else -value, step)


def _json_number(value: Any) -> float | None:
    """A metric as a finite float for JSON, None when NaN/inf (ranks as missing)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _remove_atomically(path: Path) -> None:
    """Rename `path` to a hidden name first, so a crash mid-delete leaves no partial step."""
    doomed = path.with_name(f".{path.name}.deleting-{uuid.uuid4().hex[:8]}")
    os.replace(path, doomed)
    shutil.rmtree(doomed)
