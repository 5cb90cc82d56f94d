import json
import threading
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_opd.tiny import TINY_PREFIX, resolve_pretrained
from nemo_opd.tiny import assets as tiny_assets
from nemo_opd.tiny import build as tiny_build
from nemo_opd.tiny.assets import (
    assets_dir,
    ensure_tiny_assets,
    is_complete,
    recorded_heldout_accuracy,
)
from nemo_opd.tiny.recipe import default_recipe, micro_recipe, recipe_key
from nemo_opd.tiny.task import load_jsonl, load_tiny_math

MICRO = micro_recipe()


@pytest.fixture(scope="module")
def micro_cache(tmp_path_factory):
    """One micro build shared by the tests of this module: (cache dir, assets, log lines)."""
    cache = tmp_path_factory.mktemp("cache")
    logs: list[str] = []
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("NEMO_OPD_CACHE", str(cache))
        assets = ensure_tiny_assets(MICRO, log=logs.append)
    return cache, assets, logs


@pytest.fixture
def in_micro_cache(micro_cache, monkeypatch):
    cache, assets, _ = micro_cache
    monkeypatch.setenv("NEMO_OPD_CACHE", str(cache))
    return assets


def test_layout_under_cache_key(in_micro_cache):
    assets = in_micro_cache
    assert assets.root == Path(tiny_assets.cache_root()) / "tiny" / recipe_key(MICRO)
    for path in (assets.tokenizer, assets.teacher, assets.student, assets.data):
        assert path.is_dir()
    for role in ("teacher", "student"):
        assert (getattr(assets, role) / "model.safetensors").is_file()
        assert (getattr(assets, role) / "generation_config.json").is_file()


def test_build_logs_progress(micro_cache):
    _, _, logs = micro_cache
    text = "\n".join(logs)
    for phase in ("data:", "tokenizer:", "teacher: step", "student: step", "held-out accuracy"):
        assert phase in text
    assert "eta" in text


def test_manifest_records_recipe_and_results(in_micro_cache):
    manifest = in_micro_cache.manifest()
    assert manifest["key"] == recipe_key(MICRO)
    assert manifest["recipe"] == json.loads(json.dumps(asdict(MICRO)))
    for role in ("teacher", "student"):
        entry = manifest["models"][role]
        assert 0.0 <= entry["heldout_accuracy"] <= 1.0
        assert entry["parameters"] > 0
    assert set(manifest["timings_seconds"]) >= {"data", "tokenizer", "teacher", "student", "total"}
    assert manifest["versions"]["torch"] == torch.__version__


def test_data_files_are_the_task_splits(in_micro_cache):
    assets = in_micro_cache
    assert load_jsonl(assets.train_file) == load_tiny_math("train", MICRO.task)
    assert load_jsonl(assets.validation_file) == load_tiny_math("validation", MICRO.task)


@pytest.mark.parametrize("role", ["teacher", "student"])
def test_models_load_with_auto_classes(in_micro_cache, role):
    path = getattr(in_micro_cache, role)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    assert type(model).__name__ == "Qwen3ForCausalLM"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.tie_word_embeddings
    assert (
        model.config.eos_token_id
        == tokenizer.eos_token_id
        == tokenizer.convert_tokens_to_ids("<|im_end|>")
    )
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    recipe = getattr(MICRO, role)
    assert model.config.hidden_size == recipe.hidden_size
    assert model.config.head_dim == recipe.head_dim
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )["input_ids"]
    logits = model(ids).logits
    assert logits.shape == (1, ids.shape[1], len(tokenizer))


def test_models_are_trained_not_initial(in_micro_cache):
    from nemo_opd.tiny.model import build_tiny_model

    tokenizer = AutoTokenizer.from_pretrained(in_micro_cache.tokenizer)
    initial = build_tiny_model(MICRO.teacher, tokenizer, seed=MICRO.teacher_train.seed)
    saved = load_file(in_micro_cache.teacher / "model.safetensors")
    name = "model.layers.0.mlp.down_proj.weight"
    assert not torch.equal(saved[name], initial.state_dict()[name])


def test_second_call_reuses_the_build(in_micro_cache, monkeypatch):
    before = in_micro_cache.manifest()["build_id"]
    mtime = (in_micro_cache.teacher / "model.safetensors").stat().st_mtime_ns

    def no_build(*args, **kwargs):
        raise AssertionError("rebuilt a cached recipe")

    monkeypatch.setattr(tiny_build, "build_tiny_assets", no_build)
    again = ensure_tiny_assets(MICRO)
    assert again == in_micro_cache
    assert again.manifest()["build_id"] == before
    assert (again.teacher / "model.safetensors").stat().st_mtime_ns == mtime


def test_recipe_key_is_stable_and_sensitive():
    assert recipe_key(micro_recipe()) == recipe_key(MICRO)
    assert recipe_key(default_recipe()) != recipe_key(MICRO)
    longer = replace(MICRO, teacher_train=replace(MICRO.teacher_train, steps=5))
    assert recipe_key(longer) != recipe_key(MICRO)
    assert recipe_key(replace(MICRO, format_version=MICRO.format_version + 1)) != recipe_key(MICRO)
    assert len(recipe_key(MICRO)) == 12


def test_resolve_pretrained_passes_other_names_through():
    for name in ("Qwen/Qwen3-0.6B", "/models/qwen3", "relative/dir", "tinyllama", ""):
        assert resolve_pretrained(name) == name


def test_resolve_pretrained_maps_tiny_names(in_micro_cache, monkeypatch):
    monkeypatch.setattr(tiny_assets, "default_recipe", micro_recipe)
    for name in ("teacher", "student", "tokenizer"):
        assert resolve_pretrained(TINY_PREFIX + name) == str(getattr(in_micro_cache, name))
    with pytest.raises(ValueError, match="unknown tiny asset"):
        resolve_pretrained("tiny:oracle")


def small_variant(seed: int):
    return replace(MICRO, student_train=replace(MICRO.student_train, seed=seed))


def test_failed_build_leaves_no_valid_looking_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    recipe = small_variant(seed=11)
    real = tiny_build.build_model_role

    def crash_on_student(role, *args, **kwargs):
        if role == "student":
            raise KeyboardInterrupt  # like Ctrl-C half way through
        return real(role, *args, **kwargs)

    monkeypatch.setattr(tiny_build, "build_model_role", crash_on_student)
    with pytest.raises(KeyboardInterrupt):
        ensure_tiny_assets(recipe, log=lambda _: None)
    final = assets_dir(recipe)
    assert not final.exists()
    assert [p.name for p in final.parent.iterdir()] == [f".{final.name}.lock"]


def test_leftover_of_a_killed_build_is_ignored_and_removed(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    recipe = small_variant(seed=12)
    final = assets_dir(recipe)
    leftover = final.parent / f".{final.name}.building-killed"
    (leftover / "teacher").mkdir(parents=True)
    (leftover / "manifest.json").write_text("{}")  # even a complete-looking one
    assert not is_complete(final)
    assets = ensure_tiny_assets(recipe, log=lambda _: None)
    assert is_complete(assets.root)
    assert not leftover.exists()


def test_concurrent_callers_build_once(tmp_path, monkeypatch):
    monkeypatch.setenv("NEMO_OPD_CACHE", str(tmp_path))
    recipe = small_variant(seed=13)
    builds = []
    real = tiny_build.build_tiny_assets

    def counting_build(*args, **kwargs):
        builds.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(tiny_build, "build_tiny_assets", counting_build)
    results = []
    threads = [
        threading.Thread(target=lambda: results.append(ensure_tiny_assets(recipe, log=print)))
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(builds) == 1
    assert len(results) == 2 and results[0] == results[1]
    assert is_complete(results[0].root)


def test_recorded_heldout_accuracy(in_micro_cache, tmp_path):
    manifest = in_micro_cache.manifest()
    for role in ("teacher", "student"):
        recorded = recorded_heldout_accuracy(getattr(in_micro_cache, role))
        assert recorded == manifest["models"][role]["heldout_accuracy"]
    assert recorded_heldout_accuracy(in_micro_cache.tokenizer) is None  # not a model
    (tmp_path / "model").mkdir()
    assert recorded_heldout_accuracy(tmp_path / "model") is None  # not a tiny build
    (tmp_path / "manifest.json").write_text("{not json")
    assert recorded_heldout_accuracy(tmp_path / "model") is None
