"""Prebuilt tiny assets shipped with the package, so the embedded default starts in seconds.

Building the default tiny assets trains two models (minutes on a 2-core CPU). The package ships
the result of one such build under ``nemo_opd/tiny/prebuilt/<key>/`` (tokenizer, teacher,
student, manifest and a SHA-256 of every file); ``ensure_tiny_assets`` installs it into the cache
when the cache has no build of that key. The data splits are not shipped: they are regenerated
from the recipe (deterministic, under a second). ``--rebuild`` on the command line ignores the
shipped copy and trains everything from scratch with project code.

Maintainers refresh the shipped copy after changing the recipe with::

    python -m nemo_opd.tiny --rebuild --export-prebuilt
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable
from pathlib import Path

from nemo_opd.tiny.recipe import MANIFEST, TinyRecipe, recipe_key
from nemo_opd.tiny.task import write_data_splits

PREBUILT_ROOT = Path(__file__).resolve().parent / "prebuilt"
CHECKSUMS = "checksums.json"
SHIPPED = ("tokenizer", "teacher", "student", MANIFEST)


class PrebuiltError(RuntimeError):
    """A shipped copy that does not match its checksums (a damaged install or checkout)."""


def prebuilt_dir(recipe: TinyRecipe, root: Path = PREBUILT_ROOT) -> Path | None:
    """The shipped copy of ``recipe``'s assets, or None when the package has none."""
    path = root / recipe_key(recipe)
    return path if (path / CHECKSUMS).is_file() else None


def file_checksums(root: Path) -> dict[str, str]:
    """{relative path: sha256 hex} of every shipped file under ``root``."""
    sums = {}
    for name in SHIPPED:
        entry = root / name
        if not entry.exists():  # a recipe without a student
            continue
        files = sorted(p for p in entry.rglob("*") if p.is_file()) if entry.is_dir() else [entry]
        for file in files:
            sums[file.relative_to(root).as_posix()] = hashlib.sha256(file.read_bytes()).hexdigest()
    return sums


def install_prebuilt(
    recipe: TinyRecipe, source: Path, build_dir: Path, log: Callable[[str], None]
) -> None:
    """Copy the shipped files into ``build_dir`` (checking every checksum) and regenerate the
    data splits; the manifest is copied last, as a build writes it last."""
    expected = json.loads((source / CHECKSUMS).read_text())
    found = file_checksums(source)
    if found != expected:
        damaged = sorted(set(expected.items()) ^ set(found.items()))
        raise PrebuiltError(
            f"the prebuilt tiny assets in {source} do not match {CHECKSUMS} "
            f"(first mismatch: {damaged[0][0]}); reinstall nemo_opd or build them with "
            "`python -m nemo_opd.tiny --rebuild`"
        )
    _copy_models(source, build_dir)
    write_data_splits(recipe.task, build_dir)
    shutil.copy2(source / MANIFEST, build_dir / MANIFEST)
    log(f"installed the prebuilt tiny assets shipped with nemo_opd ({recipe_key(recipe)})")


def export_prebuilt(
    assets_root: Path, shipped_keys: tuple[str, ...], root: Path = PREBUILT_ROOT
) -> Path:
    """Copy a complete build (a cache directory) into the package as its shipped copy, with
    its checksums; returns the new directory. Shipped keys not in `shipped_keys` (the recipes
    the package ships now) are removed."""
    target = root / assets_root.name
    for old in root.iterdir() if root.exists() else []:
        if old.is_dir() and (old == target or old.name not in shipped_keys):
            shutil.rmtree(old)
    target.mkdir(parents=True)
    _copy_models(assets_root, target)
    shutil.copy2(assets_root / MANIFEST, target / MANIFEST)
    (target / CHECKSUMS).write_text(json.dumps(file_checksums(target), indent=2) + "\n")
    return target


def _copy_models(source: Path, target: Path) -> None:
    """The shipped directories (tokenizer, teacher, student), without the manifest."""
    for name in SHIPPED[:-1]:
        if (source / name).is_dir():  # a recipe without a student has none
            shutil.copytree(source / name, target / name)
