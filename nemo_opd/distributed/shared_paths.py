"""Directories that every node of a run must see, checked from each node at setup.

    check_shared_paths(paths_workers_use(cfg), nodes)   # SetupError naming each node that
                                                        # cannot see a directory

Workers load the models and write checkpoints on their own nodes, and the driver writes the
checkpoint's record next to what rank 0 wrote: on several nodes that takes a filesystem they
all mount at the same path (NFS, Lustre, a cloud file store). A node without it does not fail
at once; it fails at the first load or save, or worse, writes a checkpoint to its own disk that
no one resumes from. So setup runs a small task on every node that hosts workers but not the
driver (pinned there with a hard node affinity; it reserves no CPU) which looks:

- in a directory the run writes (checkpointing.checkpoint_dir), for a marker file the driver
  has just written there holding a random token: the same path on another disk lacks it;
- at a directory or file the run reads (a local model or tokenizer), for the same names and
  sizes of files as the driver sees (a hub name, not a local path, is downloaded on each node
  and not checked).
"""

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from nemo_opd.config import DistillationConfig
from nemo_opd.distributed.nodes import ClusterNode
from nemo_opd.errors import SetupError

MARKER_PREFIX = ".nemo_opd_node_check_"
LOOK_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class SharedPath:
    """A path the workers use: the config key that names it, the absolute path, and whether
    the run writes there (checked with a marker file) or only reads it (checked by listing)."""

    key: str
    path: str
    writes: bool = False


def paths_workers_use(cfg: DistillationConfig) -> list[SharedPath]:
    """The checkpoint directory, and the model and tokenizer paths of the student and of every
    teacher with workers of its own, that exist on this machine (absolute paths)."""
    paths = [SharedPath("checkpointing.checkpoint_dir", cfg.checkpointing.checkpoint_dir, True)]
    for section, model in {"policy": cfg.policy, **cfg.teacher_sections}.items():
        if section != "policy" and model.server.enabled:
            continue
        names = {"model_name": model.model_name, "tokenizer.name": model.tokenizer.name}
        for key, name in names.items():
            if Path(name).exists():
                paths.append(SharedPath(f"{section}.{key}", os.path.abspath(name)))
    return list({(p.key, p.path): p for p in paths}.values())


def fingerprint(path: str) -> list[tuple[str, int]] | None:
    """Names and sizes of the files at `path` (a directory's own files, not its subdirectories'),
    or None when nothing is there."""
    target = Path(path)
    try:
        if target.is_file():
            return [(target.name, target.stat().st_size)]
        if not target.is_dir():
            return None
        files = [item for item in target.iterdir() if item.is_file()]
        return sorted((item.name, item.stat().st_size) for item in files)
    except OSError:  # unreadable: as good as missing, for this check
        return None


def _look(checks: list[tuple[str, str | None]]) -> list[object]:
    """On a node: for each (path, marker name), the marker file's text (None if missing), or,
    without a marker, the path's fingerprint."""
    found = []
    for path, marker in checks:
        if marker is None:
            found.append(fingerprint(path))
            continue
        try:
            found.append((Path(path) / marker).read_text())
        except OSError:
            found.append(None)
    return found


def check_shared_paths(
    paths: Sequence[SharedPath], nodes: Sequence[ClusterNode], timeout_s: float = LOOK_TIMEOUT_S
) -> None:
    """SetupError unless every node in `nodes` other than the driver's sees every path as the
    driver does (see the module docstring); returns at once when all are the driver's node."""
    here = ray.get_runtime_context().get_node_id()
    others = [node for node in nodes if node.node_id != here]
    if not others or not paths:
        return
    token = uuid.uuid4().hex
    marker = MARKER_PREFIX + token
    expected = [token if p.writes else fingerprint(p.path) for p in paths]
    checks = [(p.path, marker if p.writes else None) for p in paths]
    written = [Path(p.path) / marker for p in paths if p.writes]
    try:
        for file in written:
            file.write_text(token)
        seen = _look_from(others, checks, timeout_s)
    finally:
        for file in written:
            file.unlink(missing_ok=True)
    problems = [
        f"{path.key} {path.path} {_what(path, node)}"
        for node, views in zip(others, seen, strict=True)
        for path, view, want in zip(paths, views, expected, strict=True)
        if view != want
    ]
    if problems:
        raise SetupError(
            "; ".join(problems) + ". Every node of a run needs these paths on a filesystem "
            "that all of them mount at the same path (docs/cluster.md, 'Shared filesystem'); "
            "for the tiny models, point NEMO_OPD_CACHE there"
        )


def _look_from(
    nodes: Sequence[ClusterNode], checks: list[tuple[str, str | None]], timeout_s: float
) -> list[list[object]]:
    """_look run on each node (in order); SetupError when a node does not answer in time."""
    look = ray.remote(num_cpus=0, max_retries=0)(_look)
    refs = [
        look.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node.node_id, soft=False)
        ).remote(checks)
        for node in nodes
    ]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        pairs = zip(nodes, refs, strict=True)
        silent = [node.describe() for node, ref in pairs if ref not in ready]
        for ref in refs:
            ray.cancel(ref, force=True)
        raise SetupError(
            f"nodes {', '.join(silent)} did not run a {timeout_s:g} s file check; they may have "
            "died or lack the Python environment (`ray status` lists the live nodes)"
        )
    return ray.get(refs)


def _what(path: SharedPath, node: ClusterNode) -> str:
    if path.writes:
        return (
            f"is not visible from {node.describe()}: a marker file the driver just wrote there "
            "is missing"
        )
    return f"is not the same on {node.describe()}: missing, or other files than the driver sees"
