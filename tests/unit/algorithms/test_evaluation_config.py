"""python -m nemo_opd.evaluate before anything starts: which weights it evaluates, the config it
evaluates them with, and bad input refused with exit status 2 and one message. The evaluation
itself (a checkpoint of a tiny run: greedy accuracy, avg@k, the teacher's KL, the JSONL) runs in
tests/functional/test_nemo_rl_tiny.py."""

from pathlib import Path

import pytest

from nemo_opd.algorithms.evaluation import evaluation_config, model_folder
from nemo_opd.config import load_config
from nemo_opd.errors import SetupError
from nemo_opd.evaluate import main

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def fake_model(folder: Path) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")
    return folder


def test_the_weights_of_a_checkpoint_an_export_or_the_newest_step(tmp_path, capsys):
    export = fake_model(tmp_path / "final_model")
    assert model_folder(export) == export
    for step in (2, 10):
        fake_model(tmp_path / "checkpoints" / f"step_{step}" / "policy")
    assert (
        model_folder(tmp_path / "checkpoints" / "step_2") == tmp_path / "checkpoints/step_2/policy"
    )
    assert model_folder(tmp_path / "checkpoints") == tmp_path / "checkpoints/step_10/policy"
    assert "the newest checkpoint of" in capsys.readouterr().out
    with pytest.raises(SetupError, match="no such folder"):
        model_folder(tmp_path / "absent")
    with pytest.raises(SetupError, match="no model in"):
        model_folder(tmp_path)


def test_the_evaluation_config(tmp_path):
    cfg = load_config(TINY, ["policy.lora.enabled=true"])
    weights = fake_model(tmp_path / "final_model")
    evaluated = evaluation_config(cfg, weights, tmp_path / "out", samples=3, temperature=0.5)
    assert evaluated.policy.model_name == str(weights.resolve())
    assert evaluated.policy.tokenizer == cfg.policy.tokenizer  # the run's tokenizer
    assert not evaluated.policy.lora.enabled  # an export is merged
    assert not evaluated.checkpointing.enabled  # nothing resumed over the weights
    assert evaluated.checkpointing.checkpoint_dir == str((tmp_path / "out").resolve())
    assert evaluated.logger.log_dir == str((tmp_path / "out").resolve())
    assert evaluated.distillation.val_samples_per_prompt == 3
    assert evaluated.distillation.val_temperature == 0.5
    assert evaluated.data == cfg.data and evaluated.teacher == cfg.teacher


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--samples", "0"], "--samples 0: must be from 1 to 1024"),
        (["--temperature", "-1"], "--temperature -1.0: must be above 0"),
        (["distillation.nope=1"], "unknown key distillation.nope"),
    ],
)
def test_bad_input_exits_2(tmp_path, capsys, extra, message):
    fake_model(tmp_path / "m")
    argv = ["--config", str(TINY), "--checkpoint", str(tmp_path / "m"), *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err, err


def test_a_folder_without_a_model_exits_2(tmp_path, capsys):
    assert main(["--config", str(TINY), "--checkpoint", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: no model in {tmp_path}")
