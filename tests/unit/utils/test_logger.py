"""Logger: JSONL content and resume truncation, TensorBoard, W&B, rollouts, console output."""

import io
import json
import math
import sys
import types

import pytest
from rich.console import Console

from nemo_opd.config import LoggerConfig
from nemo_opd.secrets import register_secret
from nemo_opd.utils.console import StepConsole
from nemo_opd.utils.logger import WANDB_SETTINGS, Logger


def make_cfg(tmp_path, **overrides):
    """A logger config writing under tmp_path, console in plain-line mode."""
    return LoggerConfig(log_dir=str(tmp_path / "logs"), console_progress=False, **overrides)


def read_lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_has_one_flushed_record_per_step_with_null_for_non_finite(tmp_path):
    logger = Logger(make_cfg(tmp_path), run_config={"seed": 1})
    logger.log({"train/loss": 0.5, "train/reward": math.nan, "n": 3}, step=1)
    logger.log({"train/loss": math.inf}, step=2)
    metrics = tmp_path / "logs" / "metrics.jsonl"
    # Readable before close: every line is flushed.
    assert read_lines(metrics) == [
        {"step": 1, "train/loss": 0.5, "train/reward": None, "n": 3.0},
        {"step": 2, "train/loss": None},
    ]
    logger.close()
    assert json.loads((tmp_path / "logs" / "run_config.json").read_text()) == {"seed": 1}


def test_resume_drops_later_steps_and_a_torn_last_line(tmp_path):
    cfg = make_cfg(tmp_path)
    with Logger(cfg) as logger:
        for step in range(1, 6):
            logger.log({"train/loss": float(step)}, step=step)
    metrics = tmp_path / "logs" / "metrics.jsonl"
    with open(metrics, "a") as handle:
        handle.write('{"step": 6, "train/lo')  # a crash mid-write
    with Logger(cfg, resume_step=3) as logger:
        assert [r["step"] for r in read_lines(metrics)] == [1, 2, 3]
        logger.log({"train/loss": 40.0}, step=4)
    assert [r["step"] for r in read_lines(metrics)] == [1, 2, 3, 4]
    assert read_lines(metrics)[-1]["train/loss"] == 40.0
    # A new run without resume_step appends.
    with Logger(cfg) as logger:
        logger.log({"train/loss": 1.0}, step=1)
    assert [r["step"] for r in read_lines(metrics)] == [1, 2, 3, 4, 1]


def test_a_metric_that_is_not_a_number_is_an_error(tmp_path):
    with Logger(make_cfg(tmp_path)) as logger, pytest.raises(TypeError, match="'text'"):
        logger.log({"text": "hello"}, step=1)


def test_tensorboard_writes_an_events_file(tmp_path):
    cfg = make_cfg(tmp_path, jsonl_enabled=False, tensorboard_enabled=True)
    with Logger(cfg, run_config={"a": 1}) as logger:
        logger.log({"train/loss": 0.25, "bad": math.nan}, step=1)
        logger.log_rollouts([{"prompt": "p", "response": "r", "reward": 1.0}], step=1)
    events = list((tmp_path / "logs" / "tensorboard").glob("events.out.tfevents.*"))
    assert len(events) == 1 and events[0].stat().st_size > 0
    assert not (tmp_path / "logs" / "metrics.jsonl").exists()


def test_missing_wandb_says_how_to_fix_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # makes `import wandb` fail
    with pytest.raises(ImportError, match=r"pip install wandb.*logger\.wandb_enabled=false"):
        Logger(make_cfg(tmp_path, wandb_enabled=True, wandb={"mode": "offline"}))


def test_wandb_backend_gets_config_mode_and_metrics(tmp_path, monkeypatch):
    calls = {"log": []}

    class FakeRun:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finished"] = True

    def init(**kwargs):
        calls["init"] = kwargs
        return FakeRun()

    fake = types.SimpleNamespace(
        init=init, Table=lambda columns, data: (columns, data), Settings=dict
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = make_cfg(tmp_path, wandb_enabled=True, wandb={"mode": "offline", "name": "run"})
    with Logger(cfg, run_config={"lr": 1e-3}) as logger:
        logger.log({"train/loss": 0.5, "x": math.nan}, step=7)
    assert calls["init"]["mode"] == "offline" and calls["init"]["name"] == "run"
    assert calls["init"]["config"] == {"lr": 1e-3}
    assert calls["log"] == [(7, {"train/loss": 0.5})] and calls["finished"]


def test_rollouts_are_printed_and_dumped_every_period(tmp_path, capsys):
    cfg = make_cfg(tmp_path, num_rollouts_to_log=1, rollout_dump_period=2, rollouts_log_period=1)
    records = [{"prompt": f"q{i}\nline", "response": f"a{i}", "reward": i} for i in range(3)]
    with Logger(cfg) as logger:
        logger.log_rollouts(records, step=1)
        logger.log_rollouts(records, step=2)
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "rollout 1.0 | reward 0 | prompt: q0 line | response: a0",
        "rollout 2.0 | reward 0 | prompt: q0 line | response: a0",
    ]
    dumps = sorted(p.name for p in (tmp_path / "logs" / "rollouts").iterdir())
    assert dumps == ["step_2.jsonl"]
    assert read_lines(tmp_path / "logs" / "rollouts" / "step_2.jsonl") == records


def test_sample_rollouts_show_at_the_first_step_then_every_period(tmp_path, capsys):
    # They printed at every one of a run's 350 steps.
    records = [{"prompt": "q", "response": "a", "reward": 1.0}]
    with Logger(make_cfg(tmp_path, num_rollouts_to_log=1, rollouts_log_period=50)) as logger:
        for step in range(176, 351):  # a run resumed after step 175
            logger.log_rollouts(records, step=step)
    shown = [line.split(" |")[0] for line in capsys.readouterr().out.splitlines()]
    assert shown == ["rollout 176.0", "rollout 200.0", "rollout 250.0", "rollout 300.0"] + [
        "rollout 350.0"
    ]
    with Logger(make_cfg(tmp_path, rollouts_log_period=0)) as logger:
        logger.log_rollouts(records, step=1)
    assert capsys.readouterr().out == ""


def test_console_fallback_prints_one_line_per_step(tmp_path, capsys):
    with Logger(make_cfg(tmp_path), total_steps=3) as logger:
        for step in (1, 2, 3):
            logger.log(
                {
                    "train/loss": 0.5 / step,
                    "train/reverse_kl": 1e-4,
                    "timing/train/generation": 1.5,
                    "timing/train/generation/sub": 0.1,
                    "train/tokens_per_sec": 12345.0,
                    "unlisted": 1.0,
                },
                step=step,
            )
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 3
    assert lines[0] == (
        "step 1/3 | loss 0.5 | rev_kl 1.000e-04 | generation_s 1.5 | tok/s 1.234e+04"
    )
    assert lines[2].startswith("step 3/3 | loss 0.1667")


def test_console_without_a_terminal_falls_back_to_lines():
    buffer = io.StringIO()
    console = StepConsole(5, progress=True, console=Console(file=buffer), file=buffer)
    assert not console.live
    console.update(1, {"train/loss": 2.0})
    assert buffer.getvalue() == "step 1/5 | loss 2\n"


def test_live_console_shows_progress_summary_and_rollouts():
    buffer = io.StringIO()
    rich_console = Console(file=buffer, force_terminal=True, width=120)
    console = StepConsole(4, progress=True, start_step=1, console=rich_console)
    assert console.live
    console.update(2, {"train/loss": 0.75, "train/reward": 1.0, "validation/accuracy": 0.5})
    console.print_rollouts([{"prompt": "what is 2+2?", "response": "4", "reward": 1.0}], 2)
    console.close()
    text = buffer.getvalue()
    for expected in ("val_acc", "0.75", "what is 2+2?", "2/4"):
        assert expected in text


@pytest.mark.parametrize("password", ["s3cr3t-pw", "p@ss-s3cr3t-pw"])  # httpx sends p@ss... whole
def test_no_secret_reaches_the_run_config_tensorboard_or_wandb(tmp_path, monkeypatch, password):
    """The config a run records is redacted: URL user-info (and any registered secret) never
    reaches run_config.json, TensorBoard's text or W&B's config."""
    init = {}
    fake = types.SimpleNamespace(
        init=lambda **kwargs: init.update(kwargs) or types.SimpleNamespace(finish=lambda: None),
        Settings=dict,
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    url = f"http://user:{password}@host:8000/v1"
    register_secret("0123-api-key")  # as setup does with a served teacher's API key
    run_config = {"teacher": {"server": {"base_url": url}}, "notes": ["key 0123-api-key"]}
    cfg = make_cfg(
        tmp_path, tensorboard_enabled=True, wandb_enabled=True, wandb={"mode": "offline"}
    )
    with Logger(cfg, run_config=run_config):
        pass
    written = [p.read_bytes() for p in (tmp_path / "logs").rglob("*") if p.is_file()]
    assert written and not any(b"s3cr3t-pw" in d or b"0123-api-key" in d for d in written)
    assert b"http://***@host:8000/v1" in (tmp_path / "logs" / "run_config.json").read_bytes()
    assert "s3cr3t-pw" not in json.dumps(init["config"]) and "0123-api-key" not in json.dumps(
        init["config"]
    )
    assert run_config["teacher"]["server"]["base_url"] == url  # the caller's copy is untouched


SECRET_OVERRIDE = "teacher.server.base_url=http://user:s3cr3t-argv@host:8000/v1"


def test_wandb_is_told_not_to_record_the_command_line(tmp_path, monkeypatch):
    """W&B records sys.argv (overrides, secrets among them) in its run's metadata unless told
    not to; the settings the backend passes say so, and keep git state and code out too."""
    init = {}
    fake = types.SimpleNamespace(
        init=lambda **kwargs: init.update(kwargs) or types.SimpleNamespace(finish=lambda: None),
        Settings=dict,
    )
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = make_cfg(tmp_path, wandb_enabled=True, wandb={"mode": "offline"})
    with Logger(cfg, run_config={}):
        pass
    assert init["settings"] == WANDB_SETTINGS
    assert WANDB_SETTINGS["x_disable_meta"] and WANDB_SETTINGS["disable_git"]
    assert not WANDB_SETTINGS["save_code"] and WANDB_SETTINGS["disable_job_creation"]


def test_no_secret_from_the_command_line_reaches_a_wandb_run(tmp_path, monkeypatch):
    """A real offline W&B run, started while sys.argv holds a secret (as `python run.py
    --config c.yaml teacher.server.base_url=http://user:pw@host/v1` would): no file W&B writes
    (its run file is what `wandb sync` uploads) holds it."""
    wandb = pytest.importorskip("wandb")
    for variable in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "wandb_home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setattr(sys, "argv", ["run.py", "--config", "c.yaml", SECRET_OVERRIDE])
    cfg = make_cfg(tmp_path, wandb_enabled=True, wandb={"mode": "offline", "name": "argv"})
    with Logger(cfg, run_config={"url": "http://user:s3cr3t-argv@host:8000/v1"}) as logger:
        logger.log({"train/loss": 0.5}, step=1)
    wandb.teardown()  # the service writes the run's last records as it stops
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert any(p.suffix == ".wandb" for p in written)
    assert not [p for p in written if b"s3cr3t-argv" in p.read_bytes()]
