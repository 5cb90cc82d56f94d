"""Shipped prebuilt tiny assets: exported from a build, installed into an empty cache without
training (checksums verified, data regenerated), refused when damaged, ignored by rebuild."""

import json
import shutil

import pytest

from nemo_opd.tiny import assets as tiny_assets
from nemo_opd.tiny import build as tiny_build
from nemo_opd.tiny import prebuilt as tiny_prebuilt
from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.prebuilt import CHECKSUMS, PrebuiltError, export_prebuilt, prebuilt_dir
from nemo_opd.tiny.recipe import (
    default_recipe,
    micro_recipe,
    recipe_key,
    tools_recipe,
    xtok_recipe,
)
from nemo_opd.tiny.task import load_jsonl

MICRO = micro_recipe()


@pytest.fixture(scope="module")
def shipped(tmp_path_factory):
    """A micro build exported as a shipped copy: (package prebuilt root, the original build)."""
    cache = tmp_path_factory.mktemp("build-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEMO_OPD_CACHE", str(cache))
        built = ensure_tiny_assets(MICRO, log=lambda _: None)
    root = tmp_path_factory.mktemp("package") / "prebuilt"
    export_prebuilt(built.root, (recipe_key(MICRO),), root)
    return root, built


@pytest.fixture
def empty_cache(tmp_path, monkeypatch, shipped):
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "cache"))
    real = tiny_prebuilt.prebuilt_dir
    monkeypatch.setattr(tiny_assets, "prebuilt_dir", lambda r: real(r, shipped[0]))

    def no_build(*args, **kwargs):
        raise AssertionError("trained although a prebuilt copy is shipped")

    monkeypatch.setattr(tiny_build, "build_tiny_assets", no_build)
    return monkeypatch


def test_export_writes_checksums_of_every_file(shipped):
    root, built = shipped
    target = prebuilt_dir(MICRO, root)
    assert target is not None and target.name == recipe_key(MICRO)
    sums = json.loads((target / CHECKSUMS).read_text())
    assert "teacher/model.safetensors" in sums and "manifest.json" in sums
    assert not (target / "data").exists()  # regenerated, not shipped


def test_install_needs_no_training_and_equals_the_build(shipped, empty_cache):
    _, built = shipped
    logs = []
    assets = ensure_tiny_assets(MICRO, log=logs.append)
    assert any("installed the prebuilt tiny assets" in line for line in logs)
    for role in ("teacher", "student"):
        ours = (getattr(assets, role) / "model.safetensors").read_bytes()
        assert ours == (getattr(built, role) / "model.safetensors").read_bytes()
    assert load_jsonl(assets.train_file) == load_jsonl(built.train_file)
    assert assets.manifest() == built.manifest()


def test_damaged_copy_is_refused_and_leaves_no_build(shipped, empty_cache, tmp_path):
    root, _ = shipped
    damaged = tmp_path / "damaged"
    shutil.copytree(root, damaged)
    weights = damaged / recipe_key(MICRO) / "student" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8] + b"\0" * 8)
    real = tiny_prebuilt.prebuilt_dir
    empty_cache.setattr(tiny_assets, "prebuilt_dir", lambda r: real(r, damaged))
    with pytest.raises(PrebuiltError, match="student/model.safetensors"):
        ensure_tiny_assets(MICRO, log=lambda _: None)
    assert not tiny_assets.is_complete(tiny_assets.assets_dir(MICRO))


def test_rebuild_ignores_the_shipped_copy(shipped, empty_cache):
    calls = []
    empty_cache.setattr(
        tiny_build, "build_tiny_assets", lambda *a, **k: calls.append(1) or _fake_build(*a)
    )
    with pytest.raises(RuntimeError, match="fake build"):
        ensure_tiny_assets(MICRO, rebuild=True, log=lambda _: None)
    assert calls == [1]


def _fake_build(*args):
    raise RuntimeError("fake build")


@pytest.mark.parametrize(
    "recipe", [default_recipe(), xtok_recipe(), tools_recipe()], ids=["default", "xtok", "tools"]
)
def test_the_shipped_recipes_are_intact(recipe, tmp_path, monkeypatch):
    shipped = prebuilt_dir(recipe)
    flag = " --xtok" if recipe.student is None else " --tools" if recipe.tools else ""
    assert shipped is not None, (
        f"no prebuilt copy of the recipe: run `python -m nemo_opd.tiny{flag} --rebuild "
        "--export-prebuilt`"
    )
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    monkeypatch.setattr(tiny_build, "build_tiny_assets", _fake_build)
    assets = ensure_tiny_assets(recipe, log=lambda _: None)
    assert assets.key == recipe_key(recipe)
    assert len(load_jsonl(assets.validation_file)) == recipe.task.num_validation
    assert (assets.teacher / "model.safetensors").is_file()


def test_a_recipe_without_a_student_ships_and_installs(tmp_path, monkeypatch):
    """A second teacher's recipe (student None, like xtok_recipe) exports its tokenizer and
    teacher beside the shipped keys it is told to keep, and installs from them."""
    from dataclasses import replace

    no_student = replace(MICRO, student=None, student_train=None)
    assert recipe_key(no_student) != recipe_key(MICRO)
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "build"))
    built = ensure_tiny_assets(no_student, log=lambda _: None)
    assert not built.student.exists() and (built.teacher / "model.safetensors").is_file()
    root = tmp_path / "prebuilt"
    (root / "stale").mkdir(parents=True)
    (root / recipe_key(MICRO)).mkdir()
    export_prebuilt(built.root, (recipe_key(MICRO), recipe_key(no_student)), root)
    assert sorted(p.name for p in root.iterdir()) == sorted([recipe_key(MICRO), built.root.name])
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path / "install"))
    real = tiny_prebuilt.prebuilt_dir
    monkeypatch.setattr(tiny_assets, "prebuilt_dir", lambda r: real(r, root))
    installed = ensure_tiny_assets(no_student, log=lambda _: None)
    assert (installed.teacher / "model.safetensors").read_bytes() == (
        built.teacher / "model.safetensors"
    ).read_bytes()
