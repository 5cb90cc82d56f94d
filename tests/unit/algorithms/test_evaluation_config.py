"""python -m nemo_opd.evaluate before anything starts: which weights it evaluates (whatever the
engines load: a checkpoint, an export, a sharded Hugging Face folder, a hub name in the local
cache), the config it evaluates them with, what it says it graded, and bad input refused with
exit status 2 and one message. The evaluation itself (a checkpoint of a tiny run: greedy
accuracy, avg@k, the teacher's KL, the JSONL) runs in tests/functional/test_nemo_rl_tiny.py.

Before: a sharded folder ("no model in ...") and a hub name ("no such folder") were refused, and
an exported model's evaluation printed `step 0/350` and "40 graded responses" for 20 prompts.
"""

import time
from pathlib import Path

import huggingface_hub
import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from nemo_opd.algorithms.evaluation import evaluation_config, model_folder
from nemo_opd.algorithms.model_checks import check_weights
from nemo_opd.config import load_config
from nemo_opd.errors import SetupError
from nemo_opd.evaluate import _print, main

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
    assert evaluated.checkpointing.resume == "force"  # an earlier evaluation's folder is its own
    assert not evaluated.logger.jsonl_enabled  # no steps: evaluate writes metrics.json
    assert evaluated.checkpointing.checkpoint_dir == str((tmp_path / "out").resolve())
    assert evaluated.logger.log_dir == str((tmp_path / "out").resolve())
    assert evaluated.distillation.val_samples_per_prompt == 3
    assert evaluated.distillation.val_temperature == 0.5
    assert evaluated.data == cfg.data and evaluated.teacher == cfg.teacher


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--samples", "-1"], "--samples -1: must be from 0 to 1024"),
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


def test_ctrl_c_ends_in_one_line(tmp_path, capsys, monkeypatch):
    def interrupted(cfg):
        raise KeyboardInterrupt

    monkeypatch.setattr("nemo_opd.evaluate._evaluate", interrupted)
    fake_model(tmp_path / "m")
    out_dir = tmp_path / "out"
    argv = [
        "--config",
        str(TINY),
        "--checkpoint",
        str(tmp_path / "m"),
        "--output-dir",
        str(out_dir),
    ]
    assert main(argv) == 130
    err = capsys.readouterr().err
    assert err == "stopped at once by SIGINT (Ctrl-C): nothing was written\n"
    assert not out_dir.exists()


def test_a_folder_without_a_model_exits_2(tmp_path, capsys):
    assert main(["--config", str(TINY), "--checkpoint", str(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith(f"error: no model in {tmp_path}")


@pytest.fixture(scope="module")
def sharded(tmp_path_factory) -> Path:
    """A small random Qwen3 saved as downloaded models are: shards behind an index."""
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
    )
    folder = tmp_path_factory.mktemp("base_model")
    Qwen3ForCausalLM(config).save_pretrained(folder, max_shard_size="20KB")
    assert (folder / "model.safetensors.index.json").is_file()
    assert not (folder / "model.safetensors").exists()
    return folder


def test_a_sharded_hugging_face_folder_is_evaluated(sharded, tmp_path):
    assert model_folder(str(sharded)) == sharded
    cfg = evaluation_config(load_config(TINY), sharded, tmp_path / "out", 0, 1.0)
    check_weights(cfg.policy, "policy")  # setup's own check takes it
    assert cfg.policy.model_name == str(sharded.resolve())
    assert cfg.distillation.val_samples_per_prompt == 0  # greedy only, as the run validates


def cache_model(cache: Path, name: str, source: Path) -> Path:
    """`source` laid out in a Hugging Face hub cache as a download of `name` leaves it."""
    repo = cache / f"models--{name.replace('/', '--')}"
    revision = "0" * 40
    snapshot = repo / "snapshots" / revision
    snapshot.mkdir(parents=True)
    for file in source.iterdir():
        (snapshot / file.name).write_bytes(file.read_bytes())
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_a_hub_name_is_evaluated_from_the_local_cache(sharded, tmp_path, monkeypatch, capsys):
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    snapshot = cache_model(cache, "acme/base-model", sharded)
    assert model_folder("acme/base-model") == snapshot
    assert f"evaluating acme/base-model from the Hugging Face cache: {snapshot}" in (
        capsys.readouterr().out
    )
    for missing in ("acme/absent", "models/studnet"):  # a typo of a local path reads the same
        with pytest.raises(SetupError) as caught:
            model_folder(missing)
        assert str(caught.value) == (
            f"--checkpoint {missing}: no such folder, and no model of that name in the local "
            f"Hugging Face cache ({cache}); give the folder of a model or checkpoint, or "
            f"download the model first (hf download {missing})"
        )


def test_a_local_path_that_is_not_there_is_no_hub_name(tmp_path):
    for missing in (tmp_path / "absent", "./models/absent", "~/absent_model"):
        with pytest.raises(SetupError, match=f"^--checkpoint {missing}: no such folder$"):
            model_folder(missing)


def test_a_model_that_is_nowhere_exits_2_at_once(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    started = time.monotonic()
    assert main(["--config", str(TINY), "--checkpoint", "models/studnet"]) == 2
    assert time.monotonic() - started < 10
    assert "error: --checkpoint models/studnet: no such folder" in capsys.readouterr().err


def graded(prompts: int, samples: int) -> list[dict]:
    records = [{"mode": "greedy", "sample": 0} for _ in range(prompts)]
    return records + [{"mode": "sampled", "sample": k % samples} for k in range(prompts * samples)]


def test_what_was_graded_is_said(tmp_path, capsys):
    metrics = {"validation/accuracy": 0.606, "timing/validation": 2.0}
    _print(metrics, tmp_path, graded(20, 0))
    out = capsys.readouterr().out
    assert "validation/accuracy  0.6060" in out and "step" not in out
    assert f"20 prompts, one greedy response each: 20 graded responses in {tmp_path}" in out
    _print(metrics, tmp_path, graded(20, 2))
    assert "20 prompts, each one greedy and 2 sampled: 60 graded responses" in (
        capsys.readouterr().out
    )
