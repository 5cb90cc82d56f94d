"""One run per checkpoint directory (a lock with its holder's name, taken over when its holder
died), and output directories checked for writing before anything starts."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nemo_opd import cli
from nemo_opd.config import load_config
from nemo_opd.errors import SetupError
from nemo_opd.utils.run_dirs import LOCK_FILE, RunLock, check_writable, with_absolute_paths

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def hold_lock_in_child(directory: Path) -> subprocess.Popen:
    """Another process (another run) that takes the lock, says so, and sleeps."""
    code = textwrap.dedent(
        f"""
        import sys, time
        from nemo_opd.utils.run_dirs import RunLock
        RunLock({str(directory)!r}).acquire()
        print("held", flush=True)
        time.sleep(120)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "held"
    return child


def test_a_second_run_is_refused_with_the_holder_named(tmp_path):
    child = hold_lock_in_child(tmp_path)
    try:
        with pytest.raises(SetupError) as error:
            RunLock(tmp_path).acquire()
        message = str(error.value)
        assert message.startswith(
            f"checkpointing.checkpoint_dir {tmp_path} is in use by another run"
        )
        assert f"host {socket.gethostname()}, pid {child.pid}, since " in message
        assert "give this run its own checkpointing.checkpoint_dir" in message
    finally:
        child.kill()
        child.wait()


def test_a_killed_runs_lock_is_taken_over(tmp_path):
    child = hold_lock_in_child(tmp_path)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    lock = RunLock(tmp_path)
    note = lock.acquire()
    assert note is not None and f"pid {child.pid}" in note
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["pid"] == os.getpid() and holder["host"] == socket.gethostname()
    lock.release()
    # A clean release leaves nothing to take over.
    again = RunLock(tmp_path)
    assert again.acquire() is None
    again.release()


def test_the_lock_is_exclusive_within_one_process_too(tmp_path):
    first = RunLock(tmp_path)
    first.acquire()
    with pytest.raises(SetupError, match=f"pid {os.getpid()}"):
        RunLock(tmp_path).acquire()
    first.release()
    first.release()  # idempotent
    RunLock(tmp_path).acquire()


def test_a_file_where_the_directory_should_be(tmp_path):
    blocker = tmp_path / "ckpt"
    blocker.write_text("not a directory")
    with pytest.raises(
        SetupError, match=rf"^checkpointing.checkpoint_dir: cannot write to {blocker}"
    ):
        RunLock(blocker).acquire()
    with pytest.raises(SetupError, match=rf"^logger.log_dir: cannot write to {blocker}/logs"):
        check_writable(blocker / "logs", "logger.log_dir")


def test_check_writable_leaves_nothing_behind(tmp_path):
    check_writable(tmp_path / "a" / "b", "logger.log_dir")
    assert list((tmp_path / "a" / "b").iterdir()) == []


def test_the_command_line_refuses_a_busy_checkpoint_directory(tmp_path, capsys):
    # Before any model, tokenizer or worker is touched: exit 2 with the holder's name.
    child = hold_lock_in_child(tmp_path / "ckpt")
    try:
        argv = ["--config", str(TINY), f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
        assert cli.main([*argv, f"logger.log_dir={tmp_path / 'logs'}"]) == cli.EXIT_CONFIG_ERROR
        err = capsys.readouterr().err
        assert "is in use by another run" in err and f"pid {child.pid}" in err
    finally:
        child.kill()
        child.wait()


def test_relative_paths_become_absolute_against_the_drivers_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "models" / "student").mkdir(parents=True)
    cfg = load_config(
        TINY,
        [
            "checkpointing.checkpoint_dir=runs/ckpt",
            "logger.log_dir=runs/logs",
            "policy.model_name=models/student",
            "policy.tokenizer.name=Qwen/Qwen3-0.6B",
        ],
    )
    resolved = with_absolute_paths(cfg)
    assert resolved.checkpointing.checkpoint_dir == str(tmp_path / "runs" / "ckpt")
    assert resolved.logger.log_dir == str(tmp_path / "runs" / "logs")
    assert resolved.policy.model_name == str(tmp_path / "models" / "student")
    assert resolved.policy.tokenizer.name == "Qwen/Qwen3-0.6B"  # a hub name, not a path here
    assert resolved.teacher.model_name == "tiny:teacher"  # resolved later, into the cache


def test_every_routed_teachers_local_paths_are_made_absolute(tmp_path, monkeypatch):
    root = Path(__file__).resolve().parents[3]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "local_teacher").mkdir()
    cfg = load_config(
        root / "examples" / "configs" / "distillation_tiny_routed.yaml",
        ["teachers.start.model_name=local_teacher"],
    )
    absolute = with_absolute_paths(cfg)
    assert absolute.teachers["start"].model_name == str(tmp_path / "local_teacher")
    assert absolute.teachers["arithmetic"].model_name == "tiny:teacher"  # not a path here
