"""CheckpointManager: atomic saves, crash safety, latest(), state round trip, top-k pruning."""

import hashlib
import json
import os

import pytest

from nemo_opd.config import CheckpointingConfig
from nemo_opd.utils.checkpoint_manager import (
    SET_ASIDE_DIR,
    STATE_FILE,
    CheckpointError,
    CheckpointManager,
)

SHA_16_W = hashlib.sha256(b"w" * 16).hexdigest()


def make_manager(tmp_path, **overrides):
    cfg = CheckpointingConfig(checkpoint_dir=str(tmp_path / "ckpt"), **overrides)
    return CheckpointManager(cfg)


def write_weights(directory):
    """Stands in for Policy.save: a nested subdirectory with a file."""
    (directory / "policy").mkdir()
    (directory / "policy" / "weights.bin").write_bytes(b"w" * 16)


def save(manager, step, accuracy=None):
    metrics = {} if accuracy is None else {"validation/accuracy": accuracy}
    return manager.save(step, write_weights, state={"loader": {"epoch": step}}, metrics=metrics)


def steps(manager):
    return list(manager.checkpoints())


def test_training_state_round_trip(tmp_path):
    manager = make_manager(tmp_path)
    state = {"loader": {"epoch": 2, "order": [3, 1, 2]}, "consumed": 96, "name": "x"}
    path = manager.save(5, write_weights, state=state, metrics={"a": 0.5, "b": float("nan")})
    assert path == manager.path_for(5) and (path / "policy" / "weights.bin").is_file()
    record = manager.load_state(path)
    assert record.pop("files") == {"policy/weights.bin": {"bytes": 16, "sha256": SHA_16_W}}
    assert record == {"step": 5, "metrics": {"a": 0.5, "b": None}, "state": state}
    assert manager.latest() == path
    with pytest.raises(CheckpointError, match=STATE_FILE):
        manager.load_state(tmp_path)


def test_latest_is_none_without_checkpoints(tmp_path):
    assert make_manager(tmp_path).latest() is None


def test_crash_inside_write_fn_leaves_previous_checkpoints(tmp_path):
    manager = make_manager(tmp_path, keep_top_k=None)
    save(manager, 1)
    save(manager, 2)

    def crash(directory):
        write_weights(directory)
        raise RuntimeError("killed mid-save")

    with pytest.raises(RuntimeError, match="mid-save"):
        manager.save(3, crash, state={}, metrics={})
    with pytest.raises(TypeError):  # a state that is not JSON fails the same way
        manager.save(3, write_weights, state={"x": object()}, metrics={})
    assert sorted(os.listdir(manager.root)) == ["step_1", "step_2"]
    assert manager.latest() == manager.path_for(2)
    assert manager.load_state(manager.latest())["state"] == {"loader": {"epoch": 2}}


def test_latest_ignores_and_cleans_half_written_leftovers(tmp_path):
    manager = make_manager(tmp_path)
    save(manager, 1)
    # What a killed process leaves: a temporary save, an interrupted delete, a step dir
    # made by hand without training_state.json, a checkpoint moved aside mid-overwrite, and
    # a final export's folders (utils.export_folder around the engine's own).
    leftovers = (".step_2.tmp-abc", ".step_0.deleting-1234", ".final_model.tmp-ab12")
    for name in (*leftovers, "..final_model.tmp-ab12.tmp-cd34", ".final_model.tmp-ab.previous"):
        (manager.root / name).mkdir()
        (manager.root / name / STATE_FILE).write_text("{}")
    (manager.root / "step_9").mkdir()
    os.replace(save(manager, 4), manager.root / "step_4.previous")
    assert manager.latest() == manager.path_for(4)
    assert sorted(os.listdir(manager.root)) == ["step_1", "step_4", "step_9"]


def test_overwriting_a_step_is_atomic(tmp_path):
    manager = make_manager(tmp_path)
    save(manager, 1, accuracy=0.1)
    save(manager, 1, accuracy=0.2)
    assert os.listdir(manager.root) == ["step_1"]
    assert manager.load_state(manager.latest())["metrics"] == {"validation/accuracy": 0.2}


def test_keep_top_k_by_metric_always_keeps_the_latest(tmp_path):
    manager = make_manager(tmp_path, keep_top_k=2, metric_name="validation/accuracy")
    for step, accuracy in [(1, 0.5), (2, 0.9), (3, 0.1), (4, 0.7), (5, 0.2)]:
        save(manager, step, accuracy)
    assert steps(manager) == [2, 4, 5]  # best two (0.9, 0.7) plus the latest


def test_keep_top_k_lower_is_better_and_missing_metric_ranks_last(tmp_path):
    cfg = {"keep_top_k": 2, "metric_name": "loss", "higher_is_better": False}
    manager = make_manager(tmp_path, **cfg)
    for step, loss in [(1, 0.3), (2, None), (3, 0.1), (4, 0.2), (5, None)]:
        metrics = {} if loss is None else {"loss": loss}
        manager.save(step, write_weights, state={}, metrics=metrics)
    assert steps(manager) == [3, 4, 5]


def test_keep_top_k_without_metric_keeps_the_most_recent(tmp_path):
    manager = make_manager(tmp_path, keep_top_k=2, metric_name=None)
    for step in range(1, 5):
        save(manager, step, accuracy=1.0 / step)  # ignored: no metric_name
    assert steps(manager) == [3, 4]
    assert not [p for p in os.listdir(manager.root) if p.startswith(".")]


def test_keep_top_k_null_keeps_everything(tmp_path):
    manager = make_manager(tmp_path, keep_top_k=None)
    for step in range(1, 5):
        save(manager, step, accuracy=0.5)
    assert steps(manager) == [1, 2, 3, 4]


def test_should_save_every_period_and_at_the_end(tmp_path):
    manager = make_manager(tmp_path, save_period=3)
    assert [s for s in range(1, 8) if manager.should_save(s, is_last=s == 7)] == [3, 6, 7]
    assert not make_manager(tmp_path, enabled=False).should_save(3)


def test_saved_state_file_is_plain_json(tmp_path):
    path = save(make_manager(tmp_path), 2, accuracy=0.25)
    record = json.loads((path / STATE_FILE).read_text())
    assert record["metrics"] == {"validation/accuracy": 0.25}


# ------------------------------------------------------------------ damaged checkpoints


def corrupt_record(path, how):
    """Damage a checkpoint's training_state.json the way a crash or a bad disk would."""
    state = path / STATE_FILE
    text = state.read_text()
    if how == "truncated":
        state.write_text(text[: len(text) // 2])
    elif how == "not an object":
        state.write_text("[1, 2, 3]")
    elif how == "empty":
        state.write_text("")


@pytest.mark.parametrize("how", ["truncated", "not an object", "empty"])
def test_an_unreadable_older_record_never_stops_a_save(tmp_path, how):
    # Before: every later save crashed in pruning, after the new step was written.
    manager = make_manager(tmp_path, keep_top_k=1, metric_name="validation/accuracy")
    save(manager, 1, accuracy=0.9)
    corrupt_record(manager.path_for(1), how)
    for step in (2, 3, 4):
        save(manager, step, accuracy=0.1 * step)
    # The unreadable one is kept (not pruned: it is not ours to destroy), the best readable
    # one and the latest too.
    assert steps(manager) == [1, 4]
    assert manager.resume_point().path == manager.path_for(4)


def truncate(file):
    file.write_bytes(file.read_bytes()[:5])


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (lambda p: truncate(p / "policy" / "weights.bin"), "has 5 bytes, 16 written"),
        (lambda p: (p / "policy" / "weights.bin").write_bytes(b""), "has 0 bytes, 16 written"),
        (lambda p: (p / "policy" / "weights.bin").write_bytes(b"x" * 16), "checksum"),
        (lambda p: __import__("shutil").rmtree(p / "policy"), "weights.bin is missing"),
        (lambda p: corrupt_record(p, "truncated"), "cannot be read"),
        (lambda p: corrupt_record(p, "not an object"), "not a checkpoint record"),
    ],
)
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_one_used(
    tmp_path, damage, reason
):
    # Before: resume took the damaged one and failed with a raw SafetensorError/JSONDecodeError.
    manager = make_manager(tmp_path, keep_top_k=None)
    save(manager, 1)
    save(manager, 2)
    damage(manager.path_for(2))
    point = manager.resume_point()
    assert point.path == manager.path_for(1)
    [(moved, why)] = point.set_aside
    assert moved == manager.root / SET_ASIDE_DIR / "step_2" and moved.is_dir()
    assert reason in why
    assert steps(manager) == [1]
    # Set aside, not deleted; a later damaged step_2 gets a free name beside it.
    save(manager, 2)
    damage(manager.path_for(2))
    assert manager.resume_point().set_aside[0][0] == moved.with_name("step_2-1")


def test_every_checkpoint_damaged_means_a_fresh_start(tmp_path):
    manager = make_manager(tmp_path)
    save(manager, 1)
    truncate(manager.path_for(1) / "policy" / "weights.bin")
    point = manager.resume_point()
    assert point.path is None and len(point.set_aside) == 1


def test_a_symlinked_step_directory_is_never_followed(tmp_path):
    # Before: pruning crashed on it (rmtree of a symbolic link).
    manager = make_manager(tmp_path, keep_top_k=1, metric_name=None)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_weights(elsewhere)
    (elsewhere / STATE_FILE).write_text(json.dumps({"step": 7, "metrics": {}, "state": {}}))
    save(manager, 1)
    (manager.root / "step_7").symlink_to(elsewhere, target_is_directory=True)
    for step in (2, 3):
        save(manager, step)
    assert steps(manager) == [3]
    assert (manager.root / "step_7").is_symlink() and (elsewhere / "policy").is_dir()


def test_record_lists_every_file_with_size_and_checksum(tmp_path):
    manager = make_manager(tmp_path)

    def write(directory):
        (directory / "a").mkdir()
        (directory / "a" / "x.bin").write_bytes(b"abc")
        (directory / "top.json").write_text("{}")

    path = manager.save(1, write)
    assert manager.load_state(path)["files"] == {
        "a/x.bin": {"bytes": 3, "sha256": hashlib.sha256(b"abc").hexdigest()},
        "top.json": {"bytes": 2, "sha256": hashlib.sha256(b"{}").hexdigest()},
    }


def test_a_checkpoint_records_the_identity_of_the_run_that_saved_it(tmp_path):
    identity = {"policy.model_name": {"policy.model_name": "tiny:student"}}
    cfg = CheckpointingConfig(checkpoint_dir=str(tmp_path / "ckpt"))
    path = CheckpointManager(cfg, identity=identity).save(1, write_weights)
    assert CheckpointManager(cfg).load_state(path)["run"] == identity


@pytest.mark.parametrize("umask", [0o022, 0o027])
def test_a_checkpoint_has_the_permissions_of_any_new_folder_and_file(tmp_path, umask):
    # safetensors writes its files owner-only (0600), and the folder was tempfile's (0700).
    import torch
    from safetensors.torch import save_file

    def write(directory):
        (directory / "policy").mkdir()
        save_file({"w": torch.zeros(2)}, directory / "policy" / "model.safetensors")

    previous = os.umask(umask)
    try:
        path = make_manager(tmp_path).save(1, write)
    finally:
        os.umask(previous)
    for folder in (path, path / "policy"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~umask, folder
    for file in (path / STATE_FILE, path / "policy" / "model.safetensors"):
        assert file.stat().st_mode & 0o777 == 0o666 & ~umask, file
