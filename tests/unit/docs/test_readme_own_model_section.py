"""README's own-model section, as written, on a CPU: its config extends the CPU recipe, its
first command (--print-config) succeeds in a user's folder with the tiny models standing in
for theirs and checks what the config names. The whole run as written:
tests/functional/test_own_model_readme.py."""

import yaml
from own_model_readme import run_as_written, section_blocks, user_folder

from nemo_opd.tiny.assets import ensure_tiny_assets


def test_the_section_extends_the_cpu_recipe_with_cpu_commands():
    config, commands = section_blocks()
    assert yaml.safe_load(config)["defaults"] == "examples/configs/own_model_cpu.yaml"
    assert len(commands) == 2
    assert commands[0] == [*commands[1], "--print-config"]
    assert commands[1][:4] == ["uv", "run", "--extra", "cpu"]


def test_print_config_as_written_in_a_users_folder(tmp_path):
    folder = user_folder(tmp_path, ensure_tiny_assets())
    _, commands = section_blocks()
    result = run_as_written(commands[0], folder, timeout=300)
    assert result.returncode == 0, result.stderr
    printed = yaml.safe_load(result.stdout)
    for section, model in (("policy", "models/student"), ("teacher", "models/teacher")):
        assert printed[section]["model_name"] == model
        assert printed[section]["tokenizer"]["name"] == model  # it follows the model
    assert printed["data"]["train_path"] == str(folder / "data" / "train.jsonl")
    assert printed["cluster"]["device"] == "cpu"
    # and it checked them: the student's folder gone, the same command refuses
    (folder / "models" / "student").rename(folder / "models" / "studnet")
    refused = run_as_written(commands[0], folder, timeout=300)
    assert refused.returncode == 2
    assert "error: policy.model_name: no such folder: " in refused.stderr
