"""README's "Your own model and data" section runs as written on a CPU: its config extending
own_model_cpu.yaml, the tiny models saved as ordinary Hugging Face folders standing in for the
user's, a 50-line train.jsonl of their own, and its run command (tests/own_model_readme.py).
The run ends with its summary and leaves the final model and the logs in the recipe's own
folders."""

import pytest
from own_model_readme import run_as_written, section_blocks, user_folder

from nemo_opd.tiny.assets import ensure_tiny_assets

pytest.importorskip("vllm")


def test_the_readme_own_model_run_as_written(tmp_path):
    folder = user_folder(tmp_path, ensure_tiny_assets())
    _, commands = section_blocks()
    result = run_as_written(commands[1], folder, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    summary = result.stdout[result.stdout.index("run done: ") :].splitlines()
    assert summary[0].startswith("run done:          20 of 20 steps in ")
    assert summary[1].startswith("held-out accuracy: ") and "(step 0) -> " in summary[1]
    assert summary[2:] == [
        "final model:       runs/own_model_cpu/checkpoints/final_model",
        "metrics:           runs/own_model_cpu/logs/metrics.jsonl",
        "curves:            runs/own_model_cpu/logs/curves.png",
    ]
    assert (folder / "runs/own_model_cpu/checkpoints/final_model/config.json").is_file()
    assert "warning:" not in result.stdout  # each tokenizer is its model's own
