"""Step checkpoints: atomic saves that record what they wrote, top-k pruning by a metric, and
the newest checkpoint that verifies, to resume from.

Layout under CheckpointingConfig.checkpoint_dir:
    step_<N>/                  one complete checkpoint
        training_state.json    {"step": N, "metrics": {...}, "state": {...},
                                "files": {relative path: {"bytes": n, "sha256": hex}},
                                "run": what made it (nemo_opd.utils.run_identity)}
        ...                    whatever the caller's write_fn wrote (policy weights, optimizer)
    unreadable/step_<N>[-k]/   checkpoints that failed verification, set aside (never deleted)

Crash-safety protocol (one writer, the driver process; nemo_opd.utils.run_lock keeps other
runs out of the directory):
 1. save() builds the whole checkpoint in a hidden temporary sibling `.step_<N>.tmp-*`:
    write_fn writes into it, then training_state.json is written last, with the size and
    SHA-256 of every other file: a checkpoint is complete only when that record is.
 2. The tree is fsynced and renamed to `step_<N>` with os.replace (atomic on POSIX), so a
    `step_<N>` directory is always complete. Overwriting an existing `step_<N>` moves the old
    one to `step_<N>.previous` first and deletes it only after the rename; see
    nemo_opd.utils.checkpoint.atomic_directory.
 3. Pruning renames a doomed `step_<M>` to a hidden `.step_<M>.deleting-*` (atomic) before
    removing its files, so a crash mid-delete never leaves a partial `step_<M>`. A checkpoint
    whose record cannot be read is never pruned, and a symbolic link is never followed.
 4. resume_point() puts back a `step_<N>.previous` whose replacement never landed, removes
    leftover temporaries, and returns the newest checkpoint that verifies (its record parses
    and every file it lists is there with its size and checksum), setting aside, with the
    reason, each newer one that does not.
A crash at any point, or a file damaged later, therefore never costs more than the checkpoints
it touched: the run resumes from the newest intact one.
"""

import hashlib
import json
import math
import os
import re
import shutil
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nemo_opd.config import CheckpointingConfig
from nemo_opd.utils.checkpoint import BACKUP_SUFFIX, atomic_directory, recover_checkpoint

STATE_FILE = "training_state.json"
RUN_KEY = "run"
"""The record's identity of the run that saved it (CheckpointManager.identity)."""
SET_ASIDE_DIR = "unreadable"
_STEP_DIR = re.compile(r"step_(\d+)")
# Hidden leftovers of an interrupted save (atomic_directory), prune (this module) or final
# export (utils.export_folder's folder, and the engine's atomic_directory inside it).
_STALE = re.compile(r"\.(step_\d+|\.?final_model)\.(tmp|deleting)-.*")
_READ_CHUNK = 1 << 22


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says why."""


@dataclass
class ResumePoint:
    """What resume_point() found: the checkpoint to resume from (None: start afresh) and the
    newer ones it set aside, each with the reason and where it now lies."""

    path: Path | None
    set_aside: list[tuple[Path, str]] = field(default_factory=list)


class CheckpointManager:
    """Saves, ranks, prunes and finds step checkpoints (see the module docstring).

    identity: what made the run (run_identity.run_identity), recorded in every checkpoint it
    saves so that only the same run resumes it; None records none.
    """

    def __init__(self, cfg: CheckpointingConfig, identity: dict | None = None) -> None:
        self.cfg = cfg
        self.root = Path(cfg.checkpoint_dir)
        self.identity = identity

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
        If write_fn, serialisation or a write fails (a full disk, a file-size limit), nothing
        of this save is left behind and every earlier checkpoint is untouched.
        """
        record = {
            "step": step,
            "metrics": {key: _json_number(value) for key, value in (metrics or {}).items()},
            "state": dict(state or {}),
        }
        if self.identity is not None:
            record[RUN_KEY] = self.identity
        json.dumps(record, allow_nan=False)  # a bad state fails before anything is written
        with atomic_directory(self.path_for(step)) as tmp:
            write_fn(tmp)
            record["files"] = file_record(tmp)
            text = json.dumps(record, indent=2, allow_nan=False)
            (tmp / STATE_FILE).write_text(text, encoding="utf-8")
        self.prune(keep=step)
        return self.path_for(step)

    def checkpoints(self) -> dict[int, Path]:
        """Complete checkpoints {step: path} (real directories holding a record), by step."""
        if not self.root.is_dir():
            return {}
        found = {}
        for path in self.root.iterdir():
            match = _STEP_DIR.fullmatch(path.name)
            if match and not path.is_symlink() and (path / STATE_FILE).is_file():
                found[int(match.group(1))] = path
        return dict(sorted(found.items()))

    def resume_point(self) -> ResumePoint:
        """The newest checkpoint that verifies (after recovering from any crashed save); every
        newer one that does not is moved under unreadable/ and reported, never deleted."""
        self.recover()
        point = ResumePoint(None)
        for _, path in reversed(self.checkpoints().items()):
            try:
                self.verify(path)
            except CheckpointError as error:
                point.set_aside.append((self._set_aside(path), str(error)))
                continue
            point.path = path
            break
        return point

    def latest(self) -> Path | None:
        """The newest checkpoint that verifies (see resume_point), or None."""
        return self.resume_point().path

    def load_state(self, path: str | os.PathLike) -> dict[str, Any]:
        """The record of a checkpoint: {"step", "metrics", "state", "files"}. Raises
        CheckpointError when it is missing or unreadable."""
        state_file = Path(path) / STATE_FILE
        try:
            record = json.loads(state_file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise CheckpointError(f"{path} is not a complete checkpoint: no {STATE_FILE}") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise CheckpointError(f"{state_file} cannot be read: {error}") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise CheckpointError(f"{state_file} is not a checkpoint record (no integer step)")
        return record

    def verify(self, path: Path) -> dict[str, Any]:
        """The checkpoint's record, once every file it lists has its recorded size and
        SHA-256 (a record written before checksums existed lists none). Raises
        CheckpointError naming the first file that differs."""
        record = self.load_state(path)
        files = record.get("files", {})
        if not isinstance(files, dict):
            raise CheckpointError(f"{path / STATE_FILE}: 'files' is not a mapping")
        for name, expected in files.items():
            file = path / name
            if not file.is_file():
                raise CheckpointError(f"{file} is missing")
            size = file.stat().st_size
            if size != expected.get("bytes"):
                raise CheckpointError(f"{file} has {size} bytes, {expected.get('bytes')} written")
            if sha256_of(file) != expected.get("sha256"):
                raise CheckpointError(f"{file} does not match the checksum written with it")
        return record

    def recover(self) -> None:
        """Restore checkpoints a crashed overwrite moved aside; delete stale temporaries."""
        if not self.root.is_dir():
            return
        for path in list(self.root.iterdir()):
            if _STALE.fullmatch(path.name):
                shutil.rmtree(path, ignore_errors=True)
            elif path.name.endswith(BACKUP_SUFFIX):
                original = path.name.removesuffix(BACKUP_SUFFIX)
                if _STEP_DIR.fullmatch(original):
                    recover_checkpoint(self.root / original)

    def prune(self, keep: int | None = None) -> list[int]:
        """Delete checkpoints beyond keep_top_k; returns the deleted steps.

        Ranking: checkpoints that logged metric_name (a finite number) come first, best first
        (higher_is_better), ties to the newer; then those without it, newest first. The
        latest checkpoint (so resume works) and step `keep` (the one just saved) are always
        kept, on top of the top k, and so is any checkpoint whose record cannot be read (it
        is left for resume_point to set aside, not destroyed). keep_top_k null keeps
        everything.
        """
        if self.cfg.keep_top_k is None:
            return []
        found = self.checkpoints()
        records = {step: self._record_or_none(path) for step, path in found.items()}
        unreadable = {step for step, record in records.items() if record is None}
        readable = [step for step in found if step not in unreadable]
        ranked = sorted(
            readable, key=lambda step: self._rank_key(records[step], step), reverse=True
        )
        kept = {max(found, default=None), keep} | unreadable | set(ranked[: self.cfg.keep_top_k])
        removed = [step for step in found if step not in kept]
        for step in removed:
            _remove_atomically(found[step])
        return removed

    def _record_or_none(self, path: Path) -> dict[str, Any] | None:
        try:
            return self.load_state(path)
        except CheckpointError:
            return None

    def _rank_key(self, record: dict[str, Any], step: int) -> tuple[bool, float, int]:
        """Sort key, larger is better: (has the metric, signed metric, step)."""
        value = None
        metrics = record.get("metrics")
        if self.cfg.metric_name is not None and isinstance(metrics, dict):
            value = metrics.get(self.cfg.metric_name)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return (False, 0.0, step)
        return (True, value if self.cfg.higher_is_better else -value, step)

    def _set_aside(self, path: Path) -> Path:
        """Move a checkpoint that failed verification under unreadable/ (a free name)."""
        target_dir = self.root / SET_ASIDE_DIR
        target_dir.mkdir(exist_ok=True)
        target, index = target_dir / path.name, 1
        while target.exists():
            target, index = target_dir / f"{path.name}-{index}", index + 1
        os.replace(path, target)
        return target


def file_record(root: Path) -> dict[str, dict[str, Any]]:
    """{relative posix path: {"bytes", "sha256"}} of every regular file under `root`."""
    record = {}
    for file in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        name = file.relative_to(root).as_posix()
        record[name] = {"bytes": file.stat().st_size, "sha256": sha256_of(file)}
    return record


def sha256_of(file: Path) -> str:
    """Hex SHA-256 of a file's contents, read in chunks."""
    digest = hashlib.sha256()
    with open(file, "rb") as handle:
        while chunk := handle.read(_READ_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _json_number(value: Any) -> float | None:
    """A metric as a finite float for JSON, None when NaN/inf (ranks as missing)."""
    number = float(value)
    return number if math.isfinite(number) else None


def _remove_atomically(path: Path) -> None:
    """Rename `path` to a hidden name first, so a crash mid-delete leaves no partial step."""
    doomed = path.with_name(f".{path.name}.deleting-{uuid.uuid4().hex[:8]}")
    os.replace(path, doomed)
    shutil.rmtree(doomed)
