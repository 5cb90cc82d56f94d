"""The tiny assets cache: built once per recipe, then reused.

Assets live in ``<cache>/tiny/<key>/`` where ``<cache>`` is ``$NEMO_OPD_CACHE`` or
``~/.cache/nemo_opd`` and ``<key>`` hashes the whole recipe. A build goes into a hidden temporary
directory next to the final one and is renamed into place only when complete (``manifest.json``
written last), so a crash never leaves a directory that looks valid. A file lock per key makes
concurrent callers wait for one build instead of racing.

The default recipe's assets are also shipped prebuilt with the package (prebuilt.py): when
the cache lacks them, the shipped copy is checked and installed instead of training (seconds
instead of minutes). ``rebuild=True`` always trains from scratch.

Command line (install or build if needed, print the table; ``--eval`` re-measures accuracy from
disk; ``--rebuild`` trains from scratch; ``--export-prebuilt`` copies the build into the package)::

    python -m nemo_opd.tiny [--rebuild] [--eval] [--export-prebuilt]
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from nemo_opd.tiny.prebuilt import export_prebuilt, install_prebuilt, prebuilt_dir
from nemo_opd.tiny.recipe import (
    MANIFEST,
    ROLES,
    TinyRecipe,
    default_recipe,
    micro_recipe,
    recipe_key,
    recipe_roles,
    tools_recipe,
    xtok_recipe,
)
from nemo_opd.utils.cache_dir import cache_root

__all__ = ["TINY_NAMES", "TINY_PREFIX", "TinyAssets", "cache_root", "ensure_tiny_assets"]

TINY_PREFIX = "tiny:"
TINY_NAMES = (
    "teacher",
    "student",
    "tokenizer",
    "xtok_teacher",
    "xtok_tokenizer",
    "tools_teacher",
    "tools_student",
    "tools_tokenizer",
)
"""The "tiny:" names: the default assets' three, the teacher with another tokenizer and chat
template (xtok_recipe) with its tokenizer, and the tool task's three (tools_recipe)."""
RECIPES_BY_PREFIX = {"xtok_": xtok_recipe, "tools_": tools_recipe}
"""The recipe of the "tiny:" names with a prefix; the others are the default recipe's."""


@dataclass(frozen=True)
class TinyAssets:
    """Paths of one complete build."""

    root: Path

    @property
    def key(self) -> str:
        return self.root.name

    @property
    def tokenizer(self) -> Path:
        return self.root / "tokenizer"

    @property
    def teacher(self) -> Path:
        return self.root / "teacher"

    @property
    def student(self) -> Path:
        return self.root / "student"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def train_file(self) -> Path:
        return self.data / "train.jsonl"

    @property
    def validation_file(self) -> Path:
        return self.data / "validation.jsonl"

    @property
    def manifest_file(self) -> Path:
        return self.root / MANIFEST

    def manifest(self) -> dict:
        return json.loads(self.manifest_file.read_text())


def assets_dir(recipe: TinyRecipe) -> Path:
    """Where the assets of ``recipe`` live (whether or not they exist yet)."""
    return cache_root() / "tiny" / recipe_key(recipe)


def is_complete(path: Path) -> bool:
    """A build is complete when its manifest exists (it is written last, before the rename)."""
    return (path / MANIFEST).is_file()


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive advisory lock held while the block runs (released if the process dies)."""
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def remove_leftovers(final: Path) -> None:
    """Delete temporary directories of earlier builds of this key that crashed (only called
    while holding the lock, so no live build owns them)."""
    for leftover in final.parent.glob(f".{final.name}.*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)


def install(build_dir: Path, final: Path) -> None:
    """Move a finished build into place, replacing an older build if there is one."""
    os.chmod(build_dir, 0o755)  # mkdtemp creates it owner-only; a cache entry is readable
    if final.exists():
        retired = final.parent / f".{final.name}.retired-{uuid.uuid4().hex[:8]}"
        os.replace(final, retired)
        shutil.rmtree(retired, ignore_errors=True)
    os.replace(build_dir, final)


def prefixed_log(message: str) -> None:
    print(f"[tiny-assets] {message}", flush=True)


def ensure_tiny_assets(
    recipe: TinyRecipe | None = None,
    rebuild: bool = False,
    log: Callable[[str], None] = prefixed_log,
) -> TinyAssets:
    """The assets of ``recipe`` (default: :func:`default_recipe`), built first if needed.

    Args:
        recipe: what to build; its hash is the cache key.
        rebuild: build again even if a complete build exists, then replace it.
        log: receives progress lines.
    """
    recipe = recipe or default_recipe()
    final = assets_dir(recipe)
    if is_complete(final) and not rebuild:
        return TinyAssets(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(final.parent / f".{final.name}.lock"):
        if is_complete(final) and not rebuild:
            return TinyAssets(final)  # another process built it while we waited
        remove_leftovers(final)
        build_dir = Path(tempfile.mkdtemp(prefix=f".{final.name}.building-", dir=final.parent))
        shipped = None if rebuild else prebuilt_dir(recipe)
        try:
            if shipped is not None:
                install_prebuilt(recipe, shipped, build_dir, log)
            else:
                # Training code, imported only to build: resolving a name (every engine does)
                # needs none of it.
                from nemo_opd.tiny.build import build_tiny_assets

                log(f"building tiny assets {final.name} into {final}")
                manifest = build_tiny_assets(recipe, build_dir, log, reuse=not rebuild)
                log(f"built in {manifest['timings_seconds']['total']:.0f}s")
            install(build_dir, final)
        except BaseException:
            shutil.rmtree(build_dir, ignore_errors=True)
            raise
    return TinyAssets(final)


def evaluate_from_disk(
    assets: TinyAssets, role: str, batch_size: int, max_new_tokens: int
) -> tuple[float, float]:
    """Held-out accuracy and seconds (load + generate) of a saved model, loaded the way users
    load it."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from nemo_opd.tiny.evaluation import heldout_accuracy
    from nemo_opd.tiny.task import load_jsonl

    start = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(assets.tokenizer)
    model = AutoModelForCausalLM.from_pretrained(getattr(assets, role))
    records = load_jsonl(assets.validation_file)
    accuracy = heldout_accuracy(model, tokenizer, records, batch_size, max_new_tokens)
    return accuracy, time.perf_counter() - start


def print_table(assets: TinyAssets, measured: dict[str, tuple[float, float]]) -> None:
    """Parameters, build-time accuracy and timings per model (plus re-measured accuracy)."""
    manifest = assets.manifest()
    timings = manifest["timings_seconds"]
    print(f"tiny assets {assets.key} at {assets.root}")
    header = f"{'model':<8} {'params':>10} {'held-out acc':>13} {'train s':>8} {'build s':>8}"
    if measured:
        header += f" {'acc (now)':>10} {'eval s':>7}"
    print(header)
    for role in (r for r in ROLES if r in manifest["models"]):
        entry = manifest["models"][role]
        row = (
            f"{role:<8} {entry['parameters']:>10,} {entry['heldout_accuracy']:>13.1%} "
            f"{entry['train_seconds']:>8.1f} {timings[role]:>8.1f}"
        )
        if role in measured:
            accuracy, seconds = measured[role]
            row += f" {accuracy:>10.1%} {seconds:>7.1f}"
        print(row)
    print(
        f"build total {timings['total']:.1f}s (data {timings['data']:.1f}s, "
        f"tokenizer {timings['tokenizer']:.1f}s); built {manifest['built_at']}"
    )


def resolve_pretrained(name_or_path: str) -> str:
    """A directory or hub name that ``from_pretrained`` (or vLLM) can load.

    ``"tiny:teacher"``, ``"tiny:student"`` and ``"tiny:tokenizer"`` become directories of the
    default tiny assets, ``"tiny:xtok_teacher"`` and ``"tiny:xtok_tokenizer"`` those of the
    teacher with another tokenizer (xtok_recipe), ``"tiny:tools_*"`` those of the tool task
    (tools_recipe), each installed from the shipped copy or built on first use, and cached.
    Any other string (a hub name, a local path) is returned unchanged.
    """
    if not name_or_path.startswith(TINY_PREFIX):
        return name_or_path
    name = name_or_path[len(TINY_PREFIX) :]
    if name not in TINY_NAMES:
        expected = ", ".join(TINY_PREFIX + n for n in TINY_NAMES)
        raise ValueError(f"unknown tiny asset {name_or_path!r}; expected one of {expected}")
    for prefix, recipe in RECIPES_BY_PREFIX.items():
        if name.startswith(prefix):
            return str(getattr(ensure_tiny_assets(recipe()), name.removeprefix(prefix)))
    return str(getattr(ensure_tiny_assets(), name))


def recorded_heldout_accuracy(model_dir: str | Path) -> float | None:
    """The held-out accuracy a tiny build measured for the model in `model_dir` (its manifest
    records it for "teacher" and "student"), or None for a model that is not a tiny build."""
    model_dir = Path(model_dir)
    manifest = model_dir.parent / "manifest.json"
    try:
        entry = json.loads(manifest.read_text())["models"][model_dir.name]
        return float(entry["heldout_accuracy"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Build (if needed) and report the tiny assets.")
    parser.add_argument("--rebuild", action="store_true", help="build again and replace")
    parser.add_argument("--eval", action="store_true", help="re-measure held-out accuracy")
    parser.add_argument("--micro", action="store_true", help="the seconds-long test recipe")
    parser.add_argument(
        "--xtok", action="store_true", help="the teacher with another tokenizer (tiny:xtok_*)"
    )
    parser.add_argument("--tools", action="store_true", help="the tool task (tiny:tools_*)")
    parser.add_argument(
        "--export-prebuilt",
        action="store_true",
        help="copy the build into the package as the shipped prebuilt assets (maintainers)",
    )
    args = parser.parse_args(argv)
    recipe = default_recipe()
    for flag, chosen in (
        (args.micro, micro_recipe),
        (args.xtok, xtok_recipe),
        (args.tools, tools_recipe),
    ):
        recipe = chosen() if flag else recipe
    assets = ensure_tiny_assets(recipe, rebuild=args.rebuild)
    if args.export_prebuilt:
        shipped = tuple(recipe_key(r()) for r in (default_recipe, xtok_recipe, tools_recipe))
        print(f"prebuilt assets written to {export_prebuilt(assets.root, shipped)}")
    measured = {}
    if args.eval:
        from nemo_opd.tiny.build import quiet_progress_bars, torch_threads

        with torch_threads(recipe.torch_threads), quiet_progress_bars():
            for role in recipe_roles(recipe):
                measured[role] = evaluate_from_disk(
                    assets, role, recipe.eval_batch_size, recipe.eval_max_new_tokens
                )
    print_table(assets, measured)
