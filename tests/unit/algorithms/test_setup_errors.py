"""Bad inputs stop the run at setup with one clear message (exit status 2), before any worker
starts: wrong tokenizer pairs, missing or malformed datasets, prompts that are all too long."""

import json

import pytest

from nemo_opd.cli import main
from nemo_opd.data.tiny_math import TinyMathConfig, build_tiny_math_splits
from nemo_opd.models.tiny_assets import ensure_tiny_assets
from nemo_opd.models.tiny_recipe import micro_recipe
from nemo_opd.models.tiny_tokenizer import build_tiny_tokenizer

CONFIG = "examples/configs/distillation_tiny.yaml"


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets(micro_recipe())


def run(assets, tmp_path, *overrides):
    return main(
        [
            "--config",
            CONFIG,
            f"policy.model_name={assets.student}",
            f"policy.tokenizer.name={assets.tokenizer}",
            f"teacher.model_name={assets.teacher}",
            f"teacher.tokenizer.name={assets.tokenizer}",
            f"logger.log_dir={tmp_path / 'logs'}",
            f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}",
            *overrides,
        ]
    )


def test_different_teacher_tokenizer(assets, tmp_path, capsys):
    records = build_tiny_math_splits(TinyMathConfig(num_train=300, num_validation=5, seed=9))
    other = build_tiny_tokenizer(records["train"], 260, 2, 128)
    other.save_pretrained(tmp_path / "other")
    assert run(assets, tmp_path, f"teacher.tokenizer.name={tmp_path / 'other'}") == 2
    out = capsys.readouterr().out
    assert "the student and teacher tokenizers differ" in out
    assert "student id" in out and "teacher id" in out


def test_missing_dataset_path(assets, tmp_path, capsys):
    missing = tmp_path / "missing.jsonl"
    assert run(assets, tmp_path, "data.dataset_name=null", f"data.train_path={missing}") == 2
    assert f"data.train_path: file not found: {missing}" in capsys.readouterr().out


def test_dataset_without_the_columns(assets, tmp_path, capsys):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps({"question": "1 + 1", "solution": "2"}) + "\n")
    code = run(
        assets,
        tmp_path,
        "data.dataset_name=null",
        f"data.train_path={path}",
        f"data.val_path={path}",
    )
    assert code == 2
    out = capsys.readouterr().out
    assert "no column 'prompt' (data.prompt_key); columns: question, solution" in out


def test_empty_dataset(assets, tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    assert run(assets, tmp_path, "data.dataset_name=null", f"data.train_path={path}") == 2
    assert "has no rows" in capsys.readouterr().out


def test_all_prompts_too_long(assets, tmp_path, capsys):
    assert run(assets, tmp_path, "data.max_input_seq_length=4") == 2
    assert "all 50000 prompts are longer than 4 tokens" in capsys.readouterr().out


def test_topk_larger_than_vocabulary(assets, tmp_path, capsys):
    assert run(assets, tmp_path, "distillation.topk_logits_k=100000") == 2
    assert "distillation.topk_logits_k (100000) exceeds the vocabulary size" in (
        capsys.readouterr().out
    )


def test_tensor_parallel_must_divide_heads(assets, tmp_path, capsys):
    assert (
        run(
            assets, tmp_path, "policy.dtensor_cfg.tensor_parallel_size=4", "cluster.gpus_per_node=4"
        )
        == 2
    )
    out = capsys.readouterr().out
    assert "policy: tensor_parallel_size 4 must divide the model's num_attention_heads (2)" in out


def test_megatron_student_on_cpu_must_train_in_fp32():
    from pathlib import Path

    from nemo_opd.algorithms.model_checks import check_megatron_training_precision
    from nemo_opd.config import load_config
    from nemo_opd.errors import SetupError

    config = Path(__file__).parents[3] / "examples/configs/distillation_tiny_megatron.yaml"
    bf16 = load_config(config, ["policy.precision=bfloat16", "teacher.precision=bfloat16"])
    refused = r"policy\.precision=bfloat16 .* policy\.precision=float32"
    with pytest.raises(SetupError, match=refused):
        check_megatron_training_precision(bf16.policy, "cpu")
    check_megatron_training_precision(bf16.policy, "cuda")  # autocast training works on GPU
    check_megatron_training_precision(load_config(config).policy, "cpu")  # fp32
    dtensor = load_config(config.with_name("distillation_tiny.yaml"), ["policy.precision=bfloat16"])
    check_megatron_training_precision(dtensor.policy, "cpu")  # DTensor's autocast trains on CPU


def test_tensor_parallel_needs_whole_heads_not_a_divisible_vocabulary():
    from transformers import Qwen3Config

    from nemo_opd.algorithms.model_checks import check_tensor_parallel
    from nemo_opd.config import PolicyConfig
    from nemo_opd.errors import SetupError

    model = Qwen3Config(vocab_size=481, num_attention_heads=4, num_key_value_heads=2)

    def policy(tp: int) -> PolicyConfig:
        raw = {"model_name": "m", "tokenizer": {"name": "m"}, "max_total_sequence_length": 8}
        return PolicyConfig.model_validate({**raw, "dtensor_cfg": {"tensor_parallel_size": tp}})

    check_tensor_parallel(policy(2), model, "policy")  # 481 rows: padded by the engines
    refused = (
        r"policy: tensor_parallel_size 4 must divide the model's num_key_value_heads \(2\); .*"
        r"must divide both \(4 and 2\); the vocabulary need not divide"
    )
    with pytest.raises(SetupError, match=refused):
        check_tensor_parallel(policy(4), model, "policy")
