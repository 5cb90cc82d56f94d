"""A run resumes only its own checkpoints and appends only to its own metrics: what made a
checkpoint is recorded with it, and a new run whose models, data, objective or shapes differ is
refused at once (before Ray starts), naming each difference and the ways out; a run whose steps
are all done and exported says so and does nothing.

Before: a new config extending distillation_tiny.yaml with other models and data, run with
distillation.max_num_steps=20, resumed the other run's step_350, trained nothing, exported its
weights again and overwrote its run_config.json beside its metrics, with exit status 0.
"""

import json
import shutil
import time
from pathlib import Path

import pytest
from refused_runs import assert_shows_path
from shipped_recipes import load_recipe

from nemo_opd import cli
from nemo_opd.config import load_config
from nemo_opd.errors import SetupError
from nemo_opd.utils.checkpoint_manager import STATE_FILE, CheckpointManager
from nemo_opd.utils.export_folder import export_directory
from nemo_opd.utils.run_dirs import with_absolute_paths
from nemo_opd.utils.run_identity import (
    IDENTITY_FILE,
    check_run_folders,
    record_log_owner,
    run_identity,
)

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def config(tmp_path: Path, *overrides: str):
    folders = [f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    folders.append(f"logger.log_dir={tmp_path / 'logs'}")
    return with_absolute_paths(load_config(TINY, [*folders, *overrides]))


def finished_run(tmp_path: Path, step: int = 350, *overrides: str, identity: bool = True):
    """What a run of the tiny config leaves: its checkpoint of `step` (recording what made it
    unless not `identity`), its metrics and run_config.json, and its owner record."""
    cfg = config(tmp_path, *overrides)
    manager = CheckpointManager(cfg.checkpointing, run_identity(cfg) if identity else None)
    manager.save(step, lambda d: (d / "weights").write_bytes(b"w"), state={"loader": {}})
    logs = Path(cfg.logger.log_dir)
    logs.mkdir(parents=True, exist_ok=True)
    if identity:
        record_log_owner(cfg)
    (logs / "metrics.jsonl").write_text('{"step": 0, "validation/accuracy": 0.34}\n')
    (logs / "run_config.json").write_text(json.dumps(cfg.model_dump(mode="json")))
    return cfg


def refusal(cfg) -> str:
    with pytest.raises(SetupError) as caught:
        check_run_folders(cfg)
    return str(caught.value)


def test_another_models_and_datas_run_is_refused_naming_each_difference(tmp_path):
    finished_run(tmp_path)
    mine = tmp_path / "train.jsonl"
    mine.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    message = refusal(
        config(
            tmp_path,
            "policy.model_name=tiny:teacher",
            "data.dataset_name=null",
            f"data.train_path={mine}",
            "loss_fn.kl_type=reverse",
            "distillation.num_generations_per_prompt=4",
            "distillation.max_num_steps=20",
        )
    )
    assert message.startswith(f"checkpointing.checkpoint_dir {tmp_path / 'ckpt'} holds the ")
    assert "(newest: step 350)" in message
    for difference in (
        'policy.model_name: "tiny:student" -> "tiny:teacher"',
        'data.dataset_name: "tiny_math" -> (none)',
        'loss_fn.kl_type: "forward" -> "reverse"',
        "distillation.num_generations_per_prompt: 2 -> 4",
    ):
        assert difference in message, message
    assert_shows_path(message, "data.train_path", mine)
    assert "max_num_steps" not in message  # may change on resume
    assert "checkpointing.checkpoint_dir=" in message and "checkpointing.resume=force" in message


def test_a_long_path_is_shown_with_its_file_name(tmp_path):
    finished_run(tmp_path)
    mine = tmp_path / ("a_folder_with_a_long_name_" * 4) / "my_train_split.jsonl"
    mine.parent.mkdir()
    mine.write_text('{"prompt": "1 + 1 =", "answer": "2"}\n')
    message = refusal(config(tmp_path, "data.dataset_name=null", f"data.train_path={mine}"))
    assert "..." in message and 'my_train_split.jsonl"' in message, message
    assert_shows_path(message, "data.train_path", mine)


def test_what_may_change_on_resume_is_no_difference(tmp_path):
    finished_run(tmp_path)
    same = config(
        tmp_path,
        "distillation.max_num_steps=700",
        "distillation.val_period=50",
        "distillation.max_val_samples=20",
        "checkpointing.save_period=5",
        "checkpointing.keep_top_k=null",
        "logger.num_rollouts_to_log=0",
        "policy.optimizer.lr=1e-3",
        "loss_fn.implementation=torch",
        "cluster.cpus_per_worker=1",
    )
    assert check_run_folders(same) is None


def test_resume_force_takes_another_runs_folders_over(tmp_path):
    finished_run(tmp_path)
    forced = config(tmp_path, "policy.model_name=tiny:teacher", "checkpointing.resume=force")
    assert check_run_folders(forced) is None


def test_the_checkpoint_records_what_made_it(tmp_path):
    cfg = finished_run(tmp_path)
    record = json.loads((tmp_path / "ckpt" / "step_350" / STATE_FILE).read_text())
    assert record["run"] == json.loads(json.dumps(run_identity(cfg)))
    assert record["run"]["policy.model_name"] == {"policy.model_name": "tiny:student"}
    owner = json.loads((tmp_path / "logs" / IDENTITY_FILE).read_text())
    assert owner["checkpoint_dir"] == str(tmp_path / "ckpt")


def test_a_checkpoint_saved_before_identities_is_compared_with_its_run_config(tmp_path):
    # Its run_config.json holds the folders setup resolved the "tiny:" names to.
    cfg = finished_run(tmp_path, identity=False)
    dumped = cfg.model_dump(mode="json")
    for section in ("policy", "teacher"):
        role = "student" if section == "policy" else "teacher"
        dumped[section]["model_name"] = f"/home/u/.cache/nemo_opd/tiny/0123abcd/{role}"
        dumped[section]["tokenizer"]["name"] = "/home/u/.cache/nemo_opd/tiny/0123abcd/tokenizer"
    (tmp_path / "logs" / "run_config.json").write_text(json.dumps(dumped))
    assert check_run_folders(config(tmp_path, "distillation.max_num_steps=400")) is None
    message = refusal(config(tmp_path, "policy.model_name=tiny:teacher"))
    assert '"/home/u/.cache/nemo_opd/tiny/0123abcd/student" -> "tiny:teacher"' in message
    (tmp_path / "logs" / "run_config.json").unlink()
    message = refusal(config(tmp_path))
    assert "saved before nemo_opd recorded what made them" in message
    assert "checkpointing.resume=force" in message


def test_a_log_dir_holding_another_runs_metrics_is_refused(tmp_path):
    finished_run(tmp_path)
    # The same config with its own checkpoints but the first run's log folder.
    other = config(tmp_path, f"checkpointing.checkpoint_dir={tmp_path / 'other'}")
    message = refusal(other)
    assert message.startswith(f"logger.log_dir {tmp_path / 'logs'} holds the metrics of ")
    assert f'"{tmp_path / "ckpt"}" -> "{tmp_path / "other"}"' in message
    assert "give this run its own logger.log_dir" in message
    # Another model into a log folder of metrics whose checkpoints are gone.
    for step in (tmp_path / "ckpt").glob("step_*"):
        (step / STATE_FILE).unlink()
    message = refusal(config(tmp_path, "policy.model_name=tiny:teacher"))
    assert 'policy.model_name: "tiny:student" -> "tiny:teacher"' in message
    # Metrics that nothing tells the run of.
    (tmp_path / "logs" / IDENTITY_FILE).unlink()
    (tmp_path / "logs" / "run_config.json").unlink()
    assert "of a run that nemo_opd cannot tell" in refusal(config(tmp_path))


def test_a_new_or_empty_folder_and_a_crashed_start_of_the_same_run_are_fine(tmp_path):
    assert check_run_folders(config(tmp_path)) is None
    record_log_owner(config(tmp_path, "policy.model_name=tiny:teacher"))  # no metrics yet
    assert check_run_folders(config(tmp_path)) is None


def test_nothing_to_do_once_every_step_is_trained_and_exported(tmp_path):
    cfg = finished_run(tmp_path)
    later = config(tmp_path, "distillation.max_num_steps=20")
    assert check_run_folders(later) is None  # no final model yet: the run exports it
    final = Path(cfg.checkpointing.checkpoint_dir) / "final_model"
    with export_directory(final, {"step": 350}) as folder:
        (folder / "config.json").write_text("{}")
    assert check_run_folders(later) == (
        "nothing to do: step 350 >= 20 (distillation.max_num_steps), and "
        f"{final} holds the model of step 350; raise distillation.max_num_steps to train on, "
        "or give a new run its own checkpointing.checkpoint_dir and logger.log_dir"
    )
    assert check_run_folders(config(tmp_path, "distillation.max_num_steps=400")) is None


def test_a_run_that_starts_before_the_exported_step_may_not_write_over_it(tmp_path):
    """Before: the tiny default's command with checkpointing.enabled=false (and 3 steps), in
    the folders of a finished 350-step run, trained from step 0 and exported its 3-step model
    over the 350-step one, with no word."""
    cfg = finished_run(tmp_path)
    final = Path(cfg.checkpointing.checkpoint_dir) / "final_model"
    with export_directory(final, {"step": 350}) as folder:
        (folder / "config.json").write_text("{}")
    short = config(tmp_path, "distillation.max_num_steps=3", "checkpointing.enabled=false")
    message = refusal(short)
    assert f"checkpoint_dir {final.parent} holds the checkpoints of a run (newest: step 350)" in (
        message
    )
    assert "checkpointing.enabled=true" in message and "checkpointing.resume=force" in message
    for step in CheckpointManager(cfg.checkpointing).checkpoints().values():
        shutil.rmtree(step)  # the checkpoints deleted, the export kept
    message = refusal(short)
    assert f"{final} holds the final model that a run exported at step 350" in message
    assert "starts at step 0 (checkpointing.enabled=false: it resumes nothing)" in message
    assert "checkpointing.resume=force" in message
    forced = config(tmp_path, "checkpointing.enabled=false", "checkpointing.resume=force")
    assert check_run_folders(forced) is None


def test_a_resumed_run_may_write_over_its_own_export(tmp_path):
    cfg = finished_run(tmp_path)
    with export_directory(Path(cfg.checkpointing.checkpoint_dir) / "final_model", {"step": 350}):
        pass
    assert check_run_folders(config(tmp_path, "distillation.max_num_steps=400")) is None


def test_a_rerun_without_checkpoints_may_not_write_over_an_earlier_export(tmp_path):
    cfg = config(tmp_path, "checkpointing.enabled=false")
    final = Path(cfg.checkpointing.checkpoint_dir) / "final_model"
    assert check_run_folders(cfg) is None
    with export_directory(final, {"step": 0}) as folder:
        (folder / "config.json").write_text("{}")
    assert check_run_folders(cfg) is None  # a model of step 0 loses nothing
    with export_directory(final, {"step": 20}) as folder:
        (folder / "config.json").write_text("{}")
    assert "starts at step 0 (there is no checkpoint to resume)" in refusal(config(tmp_path))
    assert "checkpointing.enabled=false" in refusal(cfg)


def test_a_final_model_folder_of_other_files_is_refused_at_start(tmp_path):
    cfg = config(tmp_path)
    final = Path(cfg.checkpointing.checkpoint_dir) / "final_model"
    final.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        (final / name).write_text("{}")  # a final export from before exports were marked
    assert check_run_folders(cfg) is None
    (final / "notes.txt").write_text("mine")
    message = refusal(cfg)
    assert f"the export folder {final} is not empty and is not a model" in message
    assert "notes.txt" in message


def test_the_command_line_refuses_before_ray_starts(tmp_path, capsys):
    finished_run(tmp_path)
    argv = ["--config", str(TINY), f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    argv += [f"logger.log_dir={tmp_path / 'logs'}", "policy.model_name=tiny:teacher"]
    started = time.monotonic()
    assert cli.main(argv) == cli.EXIT_CONFIG_ERROR
    assert time.monotonic() - started < 10
    err = capsys.readouterr().err
    assert "error: checkpointing.checkpoint_dir " in err and "tiny:teacher" in err
    assert json.loads((tmp_path / "logs" / "run_config.json").read_text())["policy"][
        "model_name"
    ] == ("tiny:student")  # the other run's record is untouched


def test_the_command_line_refuses_to_write_a_shorter_run_over_an_export(tmp_path, capsys):
    cfg = finished_run(tmp_path)
    final = Path(cfg.checkpointing.checkpoint_dir) / "final_model"
    with export_directory(final, {"step": 350}) as folder:
        (folder / "model.safetensors").write_bytes(b"the 350-step model")
    argv = ["--config", str(TINY), f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    argv += [f"logger.log_dir={tmp_path / 'other_logs'}", "distillation.max_num_steps=3"]
    argv += ["checkpointing.enabled=false"]
    assert cli.main(argv) == cli.EXIT_CONFIG_ERROR
    err = capsys.readouterr().err
    assert "holds the checkpoints of a run (newest: step 350)" in err
    assert "checkpointing.enabled=false" in err
    assert (final / "model.safetensors").read_bytes() == b"the 350-step model"
    assert not (tmp_path / "other_logs").exists()


def test_the_command_line_says_when_there_is_nothing_to_do(tmp_path, capsys):
    cfg = finished_run(tmp_path)
    with export_directory(Path(cfg.checkpointing.checkpoint_dir) / "final_model", {"step": 350}):
        pass
    argv = ["--config", str(TINY), f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    argv += [f"logger.log_dir={tmp_path / 'logs'}", "distillation.max_num_steps=20"]
    assert cli.main(argv) == 0
    out = capsys.readouterr().out
    assert out.startswith("nothing to do: step 350 >= 20")
    # wrapped at the console's width (80 when not a terminal); only a path longer than that
    # stands alone on a longer line
    assert all(len(line) <= 80 or len(line.split()) == 1 for line in out.splitlines())
    assert "raise distillation.max_num_steps to train on" in " ".join(out.split())


def test_no_two_shipped_recipes_share_a_folder():
    folders: dict[str, str] = {}
    for recipe in sorted(TINY.parent.glob("*.yaml")):
        cfg = load_recipe(recipe)
        for folder in (cfg.checkpointing.checkpoint_dir, cfg.logger.log_dir):
            assert folder not in folders, f"{recipe.name} shares {folder} with {folders[folder]}"
            folders[folder] = recipe.name
