"""The prompts' token ids kept between runs: a dataset rendered through the chat template and
tokenized once is read back by every later run with the same data, template and tokenizer.

Rendering is Python (transformers' jinja chat template, prompt by prompt) and costs the main
thread about a second per 40,000 prompts of the tiny task, more with a real template; tokenizing
costs more CPU beside it. A run's set-up does both for every prompt of its dataset before its
first step, and a user's runs mostly repeat the data of the one before.

An entry is keyed by a hash of everything its ids depend on (`entry_key`): the formatter's
fingerprint (ChatFormatter.fingerprint: the chat template and its variables, tools, system
prompt, prompt template, the tokenizer's whole definition and the versions of the libraries
that render and encode) and the records' prompts and chat messages. Any change is another key,
so an entry is never read for other inputs; it is only ever missing (then the prompts are
rendered and encoded as without a cache, and stored). An entry is one .npz file (`ids`: every
message's ids end to end as int32; `lengths`: how many each message has), written to a
temporary file and renamed into place, so a reader never sees half of one; an entry that cannot
be read is ignored (and replaced). The newest KEEP entries are kept.

Where: `<cache>/prompts/` (`<cache>` is $NEMO_OPD_CACHE or ~/.cache/nemo_opd:
nemo_opd.utils.cache_dir); data.cache_encoded_prompts=false turns it off.
"""

import contextlib
import hashlib
import itertools
import os
import pickle
import tempfile
import time
from pathlib import Path

import numpy as np

from nemo_opd.utils.cache_dir import cache_root

FORMAT = b"nemo_opd encoded prompts 1"
"""Part of every key: a change of what an entry holds or how it is keyed changes it."""
KEEP = 16
"""Entries kept (the most recently written or read); older ones are deleted on a write."""
MAX_BYTES = 4 * 2**30
"""Bytes the kept entries may take together (the newest first); older ones are deleted."""
PARTIAL = ".partial-"
"""The name's start of an entry being written (renamed into place when whole)."""
STALE_PARTIAL_S = 3600.0
"""A partial entry this old was left by a writer that died; a prune deletes it."""


class PromptCache:
    """Encoded prompts stored under `root` (default: cache_root() / "prompts")."""

    def __init__(self, root: Path | None = None) -> None:
        self.root = Path(root) if root is not None else cache_root() / "prompts"

    def load(self, key: str) -> list[list[int]] | None:
        """The ids stored under `key` (one list per message, in order), or None when there is
        no readable entry."""
        path = self._path(key)
        try:
            with np.load(path) as entry:
                ids, lengths = entry["ids"], entry["lengths"]
        except Exception:  # missing, partial or foreign: as if there were none
            return None
        if lengths.ndim != 1 or ids.ndim != 1 or (lengths < 0).any() or lengths.sum() != len(ids):
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: kept by the next prune
        return _split(ids.tolist(), lengths.tolist())

    def store(self, key: str, ids: list[list[int]]) -> Path:
        """Write `ids` under `key` (atomically) and prune to the newest KEEP entries; returns
        the entry's path. OSError when the folder cannot be written."""
        lengths = np.fromiter((len(row) for row in ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(itertools.chain.from_iterable(ids), np.int64, int(lengths.sum()))
        self.root.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=self.root, prefix=PARTIAL, suffix=".npz")
        try:
            os.chmod(temporary, 0o644)  # mkstemp makes it owner-only; an entry is readable
            with os.fdopen(handle, "wb") as file:
                wide = flat.size and int(flat.max()) >= 2**31  # no vocabulary is that large
                np.savez(file, ids=flat if wide else flat.astype(np.int32), lengths=lengths)
            os.replace(temporary, self._path(key))
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
        self._prune()
        return self._path(key)

    def _path(self, key: str) -> Path:
        return self.root / f"{key}.npz"

    def _prune(self) -> None:
        """Keep the most recently used entries, at most KEEP of them and MAX_BYTES in all;
        delete the rest (another run's deletion or write in between is fine)."""
        entries = []
        for path in self.root.glob("*.npz"):
            try:
                stat = path.stat()
            except OSError:
                continue
            if not path.name.startswith(PARTIAL):
                entries.append((stat.st_mtime, stat.st_size, path))
            elif time.time() - stat.st_mtime > STALE_PARTIAL_S:  # its writer is long gone
                path.unlink(missing_ok=True)
        total = 0
        for kept, (_, size, path) in enumerate(sorted(entries, reverse=True)):
            total += size
            if kept >= KEEP or (kept and total > MAX_BYTES):
                path.unlink(missing_ok=True)


def entry_key(
    fingerprint: bytes, prompts: list[str], conversations: list[list[dict] | None] | None
) -> str | None:
    """The key of the ids of `prompts` (with their chat `conversations`, where given) as a
    formatter of `fingerprint` renders and encodes them; None when the records cannot be
    serialized to be hashed (they are then rendered and encoded every run)."""
    try:
        records = pickle.dumps((prompts, conversations), protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
        return None
    digest = hashlib.blake2b(FORMAT, digest_size=20)
    digest.update(fingerprint)
    digest.update(records)
    return digest.hexdigest()


def _split(flat: list[int], lengths: list[int]) -> list[list[int]]:
    """`flat` cut into consecutive lists of the given lengths."""
    rows, start = [], 0
    for length in lengths:
        rows.append(flat[start : start + length])
        start += length
    return rows
