"""Atomic checkpoint directories: a crash mid-save never destroys the previous checkpoint.

Files are written into a temporary sibling directory, fsynced, and the directory is renamed
into place with os.replace. Replacing an existing checkpoint moves the old one aside first and
deletes it only after the new one is in place; `recover_checkpoint` puts it back if a crash
happened in between. What lands has the permissions of any new folder and file (0777 and 0666
less the umask: 0755 and 0644 under the usual 022), whatever wrote it: safetensors writes its
files owner-only, and a temporary directory is made owner-only by tempfile.
"""

import os
import resource
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

BACKUP_SUFFIX = ".previous"


def fsync_tree(path: Path) -> None:
    """fsync every file under path, then the directories."""
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(Path(root))


def fsync_dir(path: Path) -> None:
    """fsync a directory entry (makes renames inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recover_checkpoint(path: str | os.PathLike) -> None:
    """If a crash left only `path.previous`, move it back to `path`."""
    target = Path(path)
    backup = target.with_name(target.name + BACKUP_SUFFIX)
    if backup.exists() and not target.exists():
        os.replace(backup, target)
    elif backup.exists():
        shutil.rmtree(backup)


@contextmanager
def atomic_directory(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory; on normal exit it becomes `path` atomically.

    On an exception the temporary directory is removed and `path` is left untouched.
    """
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    recover_checkpoint(target)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex[:8]}")
    tmp.mkdir()
    folder_mode = tmp.stat().st_mode & 0o777  # any new folder's: 0777 less the umask
    try:
        yield tmp
        ordinary_modes(tmp, folder_mode)
        fsync_tree(tmp)
        backup = target.with_name(target.name + BACKUP_SUFFIX)
        if target.exists():
            os.replace(target, backup)
        os.replace(tmp, target)
        fsync_dir(target.parent)
        if backup.exists():
            shutil.rmtree(backup)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def ordinary_modes(root: Path, folder_mode: int) -> None:
    """Give every folder under `root` (itself included) `folder_mode` and every file
    `folder_mode` less the execute bits: the modes a new folder and file get from the umask.
    Symbolic links are left as they are (os.walk does not enter them)."""
    file_mode = folder_mode & 0o666
    for folder, _, files in os.walk(root):
        os.chmod(folder, folder_mode)
        for name in files:
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                os.chmod(path, file_mode)


@contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary file path next to `path`; on normal exit it replaces `path` atomically.

    Readers see either the old file or the complete new one, never a partial write. On an
    exception the temporary file is removed and `path` is left untouched.
    """
    target = Path(path).absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(prefix=f".{target.name}.tmp-", dir=target.parent)
    os.close(fd)
    tmp = Path(name)
    try:
        # mkstemp creates 0600 files; keep the permissions an ordinary write would give.
        os.chmod(tmp, target.stat().st_mode & 0o777 if target.exists() else 0o644)
        yield tmp
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
        fsync_dir(target.parent)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_limits(directory: str | os.PathLike) -> str:
    """What may have stopped a write in `directory`: the free space of its filesystem and this
    process's file-size limit, in words (for the message of a failed save)."""
    free = shutil.disk_usage(directory).free
    text = f"{free / 2**20:,.1f} MiB free on its filesystem"
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        text += f", and this process may not write files over {limit:,} bytes (ulimit -f)"
    return text
