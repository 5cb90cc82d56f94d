"""The pre-flight: a missing data file, a row without a configured column, and a model path
that does not exist are refused by the command line before any process starts (with
--print-config too), each named; a local path is never asked of the hub."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nemo_opd.algorithms.local_paths import TINY_PREFIX, looks_local, missing_folder
from nemo_opd.algorithms.model_checks import load_model_config
from nemo_opd.algorithms.preflight import input_problems
from nemo_opd.cli import main
from nemo_opd.config import load_config
from nemo_opd.errors import SetupError
from nemo_opd.tiny import TINY_PREFIX as TINY_PACKAGE_PREFIX
from nemo_opd.tiny.assets import ensure_tiny_assets

REPO = Path(__file__).resolve().parents[3]
RECIPE = REPO / "examples" / "configs" / "own_model_cpu.yaml"


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets()  # the shipped models: installed, not trained


@pytest.fixture
def user_dir(assets, tmp_path, monkeypatch):
    """A user's folder, the working directory: models/{student,teacher} (the tiny models as
    plain save_pretrained folders), data/{train,val}.jsonl, my_run.yaml extending the CPU
    recipe."""
    (tmp_path / "models").mkdir()
    shutil.copytree(assets.student, tmp_path / "models" / "student")
    shutil.copytree(assets.teacher, tmp_path / "models" / "teacher")
    (tmp_path / "data").mkdir()
    rows = [{"problem": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(20)]
    for name in ("train.jsonl", "val.jsonl"):
        (tmp_path / "data" / name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "my_run.yaml").write_text(
        f"defaults: {RECIPE}\n"
        "policy: {model_name: models/student}\n"
        "teacher: {model_name: models/teacher}\n"
        "data: {train_path: data/train.jsonl, val_path: data/val.jsonl}\n"
    )
    monkeypatch.chdir(tmp_path)
    return tmp_path


def problems(*overrides):
    return input_problems(load_config("my_run.yaml", list(overrides)))


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("/models/student", True),
        ("./student", True),
        ("../student", True),
        ("~/models/student", True),
        ("a/b/c", True),
        ("my models/student", True),
        ("models/studnet", True),  # ./models exists
        ("Qwen/Qwen3-4B", False),
        ("gpt2", False),
        ("tiny_math", False),
        ("http://alice:s3cr3t@127.0.0.1:9/tokenizer", False),  # a URL: left to its reader
    ],
)
def test_which_names_are_local_paths(user_dir, name, local):
    assert looks_local(name) is local


def test_org_name_is_a_hub_name_unless_its_org_is_a_folder_here(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert not looks_local("models/student")
    (tmp_path / "models").mkdir()
    assert looks_local("models/student")


def test_the_tiny_prefix_is_the_tiny_packages(user_dir):
    assert TINY_PREFIX == TINY_PACKAGE_PREFIX
    assert missing_folder("tiny:student", "policy.model_name") is None


def test_a_correct_config_has_no_problems(user_dir):
    assert problems() == []


def test_a_missing_local_model_folder_is_named_with_the_nearest(user_dir):
    [problem] = problems("policy.model_name=models/studnet")
    assert problem == (
        f"policy.model_name: no such folder: {user_dir / 'models' / 'studnet'}; did you mean "
        f"{user_dir / 'models' / 'student'}? (a local path: not asked of the hub)"
    )


def test_a_folder_that_holds_no_model_or_no_tokenizer(user_dir):
    (user_dir / "empty").mkdir()
    assert problems("teacher.model_name=empty") == [
        f"teacher.model_name: {user_dir / 'empty'} holds no Hugging Face model (none of "
        "config.json): point it at a folder written by save_pretrained"
    ]  # its tokenizer, the same folder, is not named again
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (user_dir / "models" / "teacher" / name).unlink()
    assert problems() == [
        f"teacher.tokenizer.name: {user_dir / 'models' / 'teacher'} holds no tokenizer (none "
        "of tokenizer.json, tokenizer_config.json, tokenizer.model, vocab.json): point it at a "
        "folder written by save_pretrained"
    ]


def test_a_model_folder_without_weights(user_dir):
    (user_dir / "models" / "student" / "model.safetensors").unlink()
    [problem] = problems()
    assert problem.startswith("policy.model_name: models/student has no weights (none of ")


def test_data_files_and_columns_are_checked(user_dir):
    (user_dir / "data" / "val.jsonl").write_text('{"problem": "1 + 1", "answer": "2"}\n{"x": 1}\n')
    assert problems("data.train_path=data/trian.jsonl") == [
        f"data.train_path: file not found: {user_dir / 'data' / 'trian.jsonl'}; did you mean "
        f"{user_dir / 'data' / 'train.jsonl'}?",
        f"data.val_path ({user_dir / 'data' / 'val.jsonl'}): line 2 has no column 'problem' "
        "(data.prompt_key); columns: x. Set data.prompt_key or fix the row",
    ]


def test_a_sequence_longer_than_the_students_positions(user_dir):
    # vLLM refused it when it started, after the other workers had loaded.
    [problem] = problems("policy.max_total_sequence_length=512")
    assert problem == (
        "policy.max_total_sequence_length (512) is longer than policy.model_name reads (256 "
        "positions, its max_position_embeddings): set policy.max_total_sequence_length to at "
        "most 256"
    )


def test_a_tensor_parallel_size_the_heads_do_not_divide(user_dir):
    # Refused at setup after the loop's imports (13 s on a 2-core machine); here in a second.
    [problem] = problems(
        "cluster.gpus_per_node=4",
        "policy.dtensor_cfg.tensor_parallel_size=4",  # the student's 4 heads: fine
        "teacher.dtensor_cfg.tensor_parallel_size=4",  # the teacher has 2
    )
    assert problem.startswith(
        "teacher: tensor_parallel_size 4 must divide the model's num_attention_heads (2); "
    )


def test_a_model_whose_output_head_is_not_known(user_dir):
    # Refused at setup after the loop's imports (14 s on a 2-core machine); here in a second.
    teacher_config = user_dir / "models" / "teacher" / "config.json"
    config = json.loads(teacher_config.read_text())
    teacher_config.write_text(json.dumps({**config, "model_type": "gpt2"}))
    [problem] = problems()
    assert problem.startswith(
        "teacher.model_name: model_type 'gpt2': its output head (how its logits are made from "
        "the hidden states) is not one nemo_opd reproduces; use a model of a supported family"
    )
    teacher_config.write_text(json.dumps({**config, "logit_scale": 4.0}))  # qwen3 takes none
    [problem] = problems()
    assert "model_type 'qwen3' sets logit_scale=4.0, a logit step that" in problem


def test_too_few_rows_for_one_step(user_dir):
    # The math recipe's 128 prompts per step with a 20-line file failed after 30 s.
    [problem] = problems(
        "distillation.num_prompts_per_step=32", "policy.train_global_batch_size=64"
    )
    assert problem == (
        f"distillation.num_prompts_per_step is 32 but data.train_path "
        f"({user_dir / 'data' / 'train.jsonl'}) has only 20 rows: lower "
        "distillation.num_prompts_per_step to at most 20 or add prompts"
    )


def test_a_row_without_the_answer_column(user_dir):
    (user_dir / "data" / "train.jsonl").write_text('{"problem": "1 + 1"}\n')
    [problem] = problems()
    assert "line 1 has no column 'answer' (data.answer_key); columns: problem" in problem


def test_validation_data_is_not_checked_when_the_run_never_validates(user_dir):
    (user_dir / "data" / "val.jsonl").unlink()
    assert len(problems()) == 1
    never = ("distillation.val_period=0", "distillation.val_at_start=false")
    never += ("distillation.val_at_end=false", "checkpointing.metric_name=null")
    assert problems(*never) == []


def test_print_config_refuses_every_mistake_at_once_before_any_process(user_dir, capsys):
    # All four passed --print-config (exit 0) and failed 30-40 s later, after Ray had started.
    (user_dir / "data" / "val.jsonl").write_text('{"problem": "1 + 1"}\n')
    overrides = ["policy.model_name=models/studnet", "teacher.model_name=/models/teacher"]
    overrides.append("data.train_path=data/missing.jsonl")
    assert main(["--config", "my_run.yaml", "--print-config", *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: the run's inputs have 4 problems:\n")
    for fragment in (
        "policy.model_name: no such folder:",
        "teacher.model_name: no such folder: /models/teacher",
        "data.train_path: file not found:",
        "line 1 has no column 'answer' (data.answer_key)",
    ):
        assert fragment in err


def test_a_run_is_refused_before_ray_starts(user_dir, capsys):
    assert main(["--config", "my_run.yaml", "data.train_path=data/missing.jsonl"]) == 2
    out, err = capsys.readouterr()
    assert out == ""  # no "ray: started a local instance"
    assert err.startswith("error: data.train_path: file not found:")


def test_setup_refuses_a_missing_local_model_without_asking_the_hub(user_dir, monkeypatch):
    # The hub answered `models/studnet` with five retries and "We couldn't connect to
    # 'https://huggingface.co'", and `/models/student` with "Repo id must be in the form".
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    for name in ("models/studnet", "/models/student"):
        cfg = load_config("my_run.yaml", [f"policy.model_name={name}"])
        with pytest.raises(SetupError, match=r"^policy\.model_name: no such folder: "):
            load_model_config(cfg.policy, "policy")


def test_the_command_line_imports_no_torch_transformers_or_ray():
    # The pre-flight is fast because of this.
    heavy = "{'torch', 'transformers', 'ray'}"
    code = f"import sys, nemo_opd.cli; print(sorted({heavy} & set(sys.modules)))"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert result.stdout.strip() == "[]", result.stderr
