"""Exporting a checkpoint as users load a model (python -m nemo_opd.export): Hugging Face weights
in the policy's precision with config, tokenizer, chat template and generation_config.json, and
no training state; the exported model scores as the checkpoint's fp32 weights do, within bf16's
rounding. The run's own final export (Policy.export on live workers) is checked end to end in
tests/functional/test_nemo_rl_tiny.py.

Before: the final model was the fp32 checkpoint (optimizer state beside the weights) and had no
generation_config.json; a checkpoint could not be exported at all. Then: an export into a folder
of other files deleted them (exit 0), its model.safetensors was 0600 in a 0700 folder, and its
generation_config.json sampled at the training temperature where the run validated greedily.
"""

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

from nemo_opd.export import main
from nemo_opd.policy.engines.training_state import write_training_state, write_weights
from nemo_opd.tiny.assets import resolve_pretrained

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A checkpoint (step_3/policy) of the tiny student as the engines write one: fp32 weights,
    config.json, training_state.pt and nemo_opd.json."""
    student = AutoModelForCausalLM.from_pretrained(
        resolve_pretrained("tiny:student"), dtype=torch.float32
    )
    root = tmp_path_factory.mktemp("checkpoints") / "step_3"
    policy = root / "policy"
    policy.mkdir(parents=True)
    weights = {k: v for k, v in student.state_dict().items() if k != "lm_head.weight"}
    write_weights(policy, weights, student.config.to_dict())
    write_training_state(policy, {"state": {}}, None, [], 3)
    (root / "training_state.json").write_text(json.dumps({"step": 3}))
    return root


def log_probs(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        logits = model(ids).logits.float()
    return torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None])[..., 0]


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
def test_a_checkpoint_exports_as_users_load_it(checkpoint, tmp_path, precision, capsys):
    out = tmp_path / "exported"
    argv = ["--config", str(TINY), "--checkpoint", str(checkpoint), "-o", str(out)]
    assert main([*argv, f"policy.precision={precision}"]) == 0, capsys.readouterr().err
    assert f"({precision})" in capsys.readouterr().out
    files = {path.name for path in out.iterdir()}
    assert {"config.json", "model.safetensors", "generation_config.json"} <= files
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= files
    assert not {"training_state.pt", "nemo_opd.json"} & files  # the training state stays put

    dtype = getattr(torch, precision)
    assert {t.dtype for t in load_file(out / "model.safetensors").values()} == {dtype}
    assert json.loads((out / "config.json").read_text())["dtype"] == precision
    generation = GenerationConfig.from_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.eos_token_id in _ids(generation.eos_token_id)
    # as the run validates: greedy, up to the rollouts' length (not the training sampling)
    assert not generation.do_sample and generation.temperature is None
    assert generation.max_new_tokens == 48
    assert (
        tokenizer.chat_template
        == AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer")).chat_template
    )

    # the checkpoint's weights, rounded once to the precision
    saved = load_file(checkpoint / "policy" / "model.safetensors")
    for name, tensor in load_file(out / "model.safetensors").items():
        assert torch.equal(tensor, saved[name].to(dtype)), name
    exported = AutoModelForCausalLM.from_pretrained(out)
    assert exported.dtype == dtype
    reference = AutoModelForCausalLM.from_pretrained(checkpoint / "policy", dtype=torch.float32)
    ids = tokenizer(["12 + 30 = 42", "17 + 25 = 42"], return_tensors="pt")["input_ids"]
    error = (log_probs(exported, ids) - log_probs(reference, ids)).abs().mean().item()
    assert error < (0.05 if precision == "bfloat16" else 1e-6), error


def _ids(value) -> list[int]:
    return [value] if isinstance(value, int) else list(value)


def test_what_is_not_a_model_is_refused(checkpoint, tmp_path, capsys):
    argv = ["--config", str(TINY), "-o", str(tmp_path / "out")]
    assert main([*argv, "--checkpoint", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no model in ") and "model.safetensors and config.json" in err
    lora = tmp_path / "lora_step"
    lora.mkdir()
    (lora / "adapter_model.safetensors").write_bytes(b"")
    assert main([*argv, "--checkpoint", str(lora)]) == 2
    assert "is a LoRA checkpoint (its adapters only)" in capsys.readouterr().err
    for target in (checkpoint, checkpoint / "policy", checkpoint.parent):
        same = ["--config", str(TINY), "--checkpoint", str(checkpoint), "-o", str(target)]
        assert main(same) == 2
        assert "is the checkpoint itself" in capsys.readouterr().err
    assert (checkpoint / "policy" / "training_state.pt").exists()  # nothing was replaced


def test_ctrl_c_ends_in_one_line(checkpoint, tmp_path, capsys, monkeypatch):
    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr("nemo_opd.policy.hf_export.export_checkpoint", interrupted)
    assert export(checkpoint, tmp_path / "out") == 130
    assert capsys.readouterr().err == "stopped at once by SIGINT (Ctrl-C)\n"


def export(checkpoint: Path, out: Path) -> int:
    return main(["--config", str(TINY), "--checkpoint", str(checkpoint), "-o", str(out)])


def test_a_folder_of_other_files_is_refused_and_kept(checkpoint, tmp_path, capsys):
    models = tmp_path / "models"
    (models / "my_run").mkdir(parents=True)
    (models / "notes.txt").write_text("mine")
    assert export(checkpoint, models) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the export folder {models} is not empty and is not a ")
    assert "(it holds my_run, notes.txt)" in err and f"e.g. {models / 'model'}" in err
    assert (models / "notes.txt").read_text() == "mine" and (models / "my_run").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["models"]  # nothing left beside it
    # A folder left by an interrupted replacement (<out>.previous) is no export's either.
    (tmp_path / "out.previous").mkdir()
    (tmp_path / "out.previous" / "data.csv").write_text("1,2")
    assert export(checkpoint, tmp_path / "out") == 2
    assert "out.previous is not empty" in capsys.readouterr().err
    assert (tmp_path / "out.previous" / "data.csv").exists()


def test_an_earlier_export_or_an_empty_folder_is_replaced(checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    assert export(checkpoint, out) == 0
    marker = json.loads((out / "nemo_opd_export.json").read_text())
    assert marker["exported_by"] == "nemo_opd"
    assert marker["source"] == {"checkpoint": str(checkpoint), "step": 3}
    (out / "README.md").write_text("an earlier export's own file")
    assert export(checkpoint, out) == 0, capsys.readouterr().err  # replaced whole
    assert not (out / "README.md").exists() and (out / "model.safetensors").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_exported_files_have_the_usual_permissions(checkpoint, tmp_path):
    previous = os.umask(0o022)
    try:
        assert export(checkpoint, tmp_path / "out") == 0
    finally:
        os.umask(previous)
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o755
    for file in (tmp_path / "out").iterdir():
        assert file.stat().st_mode & 0o777 == 0o644, file.name
