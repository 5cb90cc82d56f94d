"""The directories a run writes: both must be writable before anything starts, and one run
at a time may use a checkpoint directory.

check_writable() creates a directory if needed and writes and removes a probe file in it, so a
read-only location, or a file where the directory should be, stops setup at once instead of at
the first save after minutes of training.

RunLock is a `flock` on `<checkpoint_dir>/.nemo_opd.lock`, whose content says who holds it
(host, pid, start time). The kernel drops a flock when its process ends however it ends, so a
lock file left by a killed run is simply taken over (and reported); a second live run finds the
lock held and stops with the holder's name instead of deleting the first run's in-progress
save. The file descriptor is not inherited by the processes a run starts.

flock is advisory and local to a machine or a filesystem that supports it (local disks, NFSv4,
Lustre and GPFS with locking enabled); on a shared filesystem without locks, runs on different
machines are not kept apart.

with_absolute_paths() resolves the relative paths of a config against the driver's working
directory before anything uses them: the workers do not share it (on a cluster started with
`ray start`, each node's workers run where `ray start` ran), so a relative checkpoint directory
would otherwise name one directory for the driver and another for rank 0.
"""

import fcntl
import json
import os
import socket
import tempfile
import time
from pathlib import Path

from nemo_opd.config import DistillationConfig
from nemo_opd.errors import SetupError

LOCK_FILE = ".nemo_opd.lock"


class RunLock:
    """The lock on one directory. acquire() at setup, release() at shutdown (idempotent).

    Args:
        directory: the checkpoint directory (created if missing).
        key: the config key that names it, for messages.
    """

    def __init__(self, directory: str | os.PathLike, key: str = "checkpointing.checkpoint_dir"):
        self.directory = Path(directory)
        self.key = key
        self.identity: dict | None = None
        """What made the run that holds the lock (run_identity.run_identity), set by setup
        once the directories are found to be its own; its checkpoints record it."""
        self._fd: int | None = None

    @property
    def path(self) -> Path:
        return self.directory / LOCK_FILE

    def acquire(self) -> str | None:
        """Take the lock; returns a note when a killed run's lock was taken over. Raises
        SetupError when another run holds it or the directory cannot be written."""
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise SetupError(
                f"{self.key}: cannot write to {self.directory}: {error.strerror or error}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise SetupError(
                f"{self.key} {self.directory} is in use by another run ({holder}); wait for it "
                "to finish, or give this run its own checkpointing.checkpoint_dir"
            ) from None
        previous = _read(fd)
        _write(fd, {"host": socket.gethostname(), "pid": os.getpid(), "started": time.time()})
        self._fd = fd
        if not previous:
            return None
        holder = _describe(previous)
        return f"took over the lock left by a run that ended without releasing it ({holder})"

    def release(self) -> None:
        """Drop the lock and empty the file (a clean end leaves nothing to take over)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        finally:
            os.close(self._fd)  # closing releases the flock
            self._fd = None


def with_absolute_paths(cfg: DistillationConfig) -> DistillationConfig:
    """`cfg` with checkpointing.checkpoint_dir, logger.log_dir, and the model and tokenizer
    paths that exist here (not hub or "tiny:" names, nor a served teacher's model name) made
    absolute."""
    update = {
        "checkpointing": cfg.checkpointing.model_copy(
            update={"checkpoint_dir": os.path.abspath(cfg.checkpointing.checkpoint_dir)}
        ),
        "logger": cfg.logger.model_copy(update={"log_dir": os.path.abspath(cfg.logger.log_dir)}),
    }
    update["policy"] = cfg.policy.with_names(_absolute_if_local)
    if cfg.teacher is not None:  # a served teacher's model name is the server's name for it
        served = cfg.teacher.server.enabled
        update["teacher"] = cfg.teacher.with_names(_absolute_if_local, model=not served)
    if cfg.teachers is not None:
        update["teachers"] = {
            name: teacher.with_names(_absolute_if_local) for name, teacher in cfg.teachers.items()
        }
    return cfg.model_copy(update=update)


def _absolute_if_local(name: str) -> str:
    """An existing local path, made absolute; any other name (a hub name) unchanged."""
    return os.path.abspath(name) if os.path.exists(name) else name


def check_writable(directory: str | os.PathLike, key: str) -> None:
    """SetupError naming `key` unless `directory` exists (or can be made) and takes a file."""
    path = Path(directory)
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".nemo_opd-probe-") as probe:
            probe.write(b"x")
            probe.flush()
    except OSError as error:
        raise SetupError(f"{key}: cannot write to {path}: {error.strerror or error}") from None


def _read(fd: int) -> dict:
    """The holder recorded in the lock file ({} when empty or unreadable)."""
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        holder = json.loads(os.read(fd, 4096).decode("utf-8") or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _write(fd: int, holder: dict) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, json.dumps(holder).encode("utf-8"))
    os.fsync(fd)


def _describe(holder: dict) -> str:
    """`host H, pid P, since <time>` from a holder record."""
    if not holder:
        return "holder unknown"
    since = holder.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if since else "?"
    return f"host {holder.get('host', '?')}, pid {holder.get('pid', '?')}, since {when}"
