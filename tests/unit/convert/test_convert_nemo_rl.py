"""python -m nemo_opd.convert nemo-rl: NeMo-RL's distillation configs (written here in its format,
and its published ones when its repository is on the machine) become configs that load, with
every NeMo-RL key in the printed table and each conversion NeMo-RL's meaning calls for."""

from pathlib import Path

import pytest
import yaml
from nemo_rl_configs import FIXTURE_CONFIGS, FIXTURES, published_configs

from nemo_opd.cli import main as run_main
from nemo_opd.config import load_config
from nemo_opd.config.loader import deep_merge, load_with_defaults
from nemo_opd.convert.__main__ import main
from nemo_opd.convert.nemo_rl import NEMO_RL_DEFAULTS, convert_nemo_rl, leaves
from nemo_opd.convert.nemo_rl_schedule import convert_megatron_schedule, convert_torch_schedule

CONFIGS = FIXTURES / "examples" / "configs"
DTENSOR = CONFIGS / "distillation_math.yaml"
MEGATRON = CONFIGS / "distillation_math_megatron.yaml"
RECIPE = CONFIGS / "recipes" / "llm" / "distillation-recipe-fsdp2.yaml"
MEGATRON_RECIPE = CONFIGS / "recipes" / "llm" / "distillation-recipe-megatron.yaml"


def converted(tmp_path: Path, source: Path, capsys) -> tuple[dict, str]:
    """Convert through the command line (exit 0); the written YAML and the printed table."""
    out = tmp_path / f"{source.stem}.opd.yaml"
    assert main(["nemo-rl", str(source), "-o", str(out)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    return yaml.safe_load(out.read_text()), printed


def assert_converts_and_loads(tmp_path: Path, source: Path, capsys) -> None:
    out = tmp_path / f"{source.stem}.opd.yaml"
    _, printed = converted(tmp_path, source, capsys)
    for heading in ("mapped as is (", "renamed (", "changed meaning", "no equivalent, dropped"):
        assert heading in printed
    assert f"{out} loads." in printed
    # as the run's command line reads it
    assert run_main(["--config", str(out), "--print-config"]) == 0, capsys.readouterr().err
    # every NeMo-RL key has exactly one row
    conversion = convert_nemo_rl(source)
    nemo_rl = deep_merge(NEMO_RL_DEFAULTS, load_with_defaults(source))
    keys = {".".join(path) for path, _ in leaves(nemo_rl)}
    covered = [row.source for row in conversion.rows]
    missing = [key for key in keys if not any(_covers(row, key) for row in covered)]
    assert not missing, missing
    assert len(covered) == len(set(covered)), "a key has two rows"


def _covers(row_source: str, key: str) -> bool:
    return key == row_source or key.startswith(row_source + ".")


@pytest.mark.parametrize("source", FIXTURE_CONFIGS, ids=lambda p: p.name)
def test_a_nemo_rl_config_converts_and_loads(tmp_path, source, capsys):
    assert_converts_and_loads(tmp_path, source, capsys)


def test_nemo_rl_s_published_configs_convert_and_load(tmp_path, capsys):
    for source in published_configs(tmp_path / "nemo_rl"):
        assert_converts_and_loads(tmp_path, source, capsys)


def test_the_dtensor_config_s_conversions(tmp_path, capsys):
    cfg, printed = converted(tmp_path, DTENSOR, capsys)
    policy, teacher = cfg["policy"], cfg["teacher"]
    assert policy["optimizer"] == {
        "name": "adamw",
        "lr": 1e-5,
        "weight_decay": 0.0,
        "betas": [0.9, 0.98],
        "eps": 1e-7,
    }
    assert policy["scheduler"] == {"name": "constant", "warmup_steps": 15}
    assert "the warmup starts from 0 here, from 0.1 x lr in NeMo-RL" in printed
    assert cfg["loss_fn"] == {"kl_type": "mixed", "mixed_kl_weight": 0.25, "tail": "renormalize"}
    assert policy["logits_chunk_tokens"] == 512
    # the teacher: merged from the student (<<: *STUDENT), frozen
    assert (
        teacher["model_name"] == "Qwen/Qwen3-8B"
        and teacher["dtensor_cfg"]["tensor_parallel_size"] == 4
    )
    assert not {"optimizer", "scheduler", "generation", "train_global_batch_size"} & set(teacher)
    # validation: NeMo-RL's sampled accuracy over `repeat` copies is avg@k here
    loop = cfg["distillation"]
    assert loop["val_samples_per_prompt"] == 8 and loop["max_val_samples"] == 32
    assert loop["val_temperature"] == 0.6
    assert cfg["checkpointing"]["metric_name"] == "validation/accuracy_avg@8"
    assert cfg["checkpointing"]["save_period"] == 25  # a multiple of val_period 25
    # data: registry names to the hub datasets they load
    data = cfg["data"]
    assert data["dataset_name"] == "agentica-org/DeepScaleR-Preview-Dataset"
    assert (data["val_dataset_name"], data["val_split"]) == ("HuggingFaceH4/aime_2024", "train")
    assert (data["prompt_key"], data["answer_key"]) == ("problem", "answer")
    assert data["max_input_seq_length"] is None
    assert Path(data["prompt_file"]) == FIXTURES / "examples" / "prompts" / "cot.txt"
    # interpolations kept where every key they name is the same here, resolved elsewhere
    assert policy["dynamic_batching"]["train_mb_tokens"].startswith("${mul:")
    assert cfg["logger"]["wandb"]["name"] == "opd-DeepScaler-mixed"


def test_kept_interpolations_follow_an_override(tmp_path, capsys):
    converted(tmp_path, DTENSOR, capsys)
    cfg = load_config(
        tmp_path / "distillation_math.opd.yaml", ["policy.max_total_sequence_length=256"]
    )
    assert cfg.policy.generation.vllm_cfg.max_model_len == 256
    assert cfg.policy.generation.max_new_tokens == 256
    assert cfg.policy.dynamic_batching.train_mb_tokens == 512


def test_the_megatron_config_s_conversions(tmp_path, capsys):
    cfg, printed = converted(tmp_path, MEGATRON, capsys)
    policy = cfg["policy"]
    assert policy["megatron_cfg"]["enabled"] and not policy["dtensor_cfg"]["enabled"]
    # NeMo-RL trains with megatron_cfg.optimizer and .scheduler when Megatron is enabled
    assert policy["optimizer"] == {
        "name": "adamw",
        "lr": 3e-5,
        "weight_decay": 0.05,
        "betas": [0.9, 0.95],
        "eps": 1e-8,
    }
    assert policy["scheduler"] == {
        "name": "cosine",
        "warmup_steps": 20,
        "min_lr_ratio": pytest.approx(0.1),
        "decay_steps": 380,
    }
    assert policy["megatron_cfg"]["pipeline_model_parallel_size"] == 1
    assert policy["megatron_cfg"]["distributed_optimizer"] is False
    printed = " ".join(printed.split())
    assert "pipeline parallelism is not supported yet" in printed
    assert "Megatron is enabled: NeMo-RL trains with megatron_cfg.optimizer" in printed
    assert cfg["teacher"]["megatron_cfg"]["tensor_model_parallel_size"] == 4
    cfg, _ = converted(tmp_path, MEGATRON_RECIPE, capsys)
    assert cfg["policy"]["scheduler"]["warmup_steps"] == 4
    assert cfg["policy"]["megatron_cfg"]["tensor_model_parallel_size"] == 1


def test_a_recipe_s_conversions(tmp_path, capsys):
    cfg, printed = converted(tmp_path, RECIPE, capsys)
    assert cfg["loss_fn"]["tail"] == "bucket" and cfg["loss_fn"]["kl_type"] == "reverse"
    assert "where NeMo-RL counts it as zero (log 1e-100)" in " ".join(printed.split())
    assert cfg["policy"]["scheduler"] == {
        "name": "cosine",
        "warmup_steps": 5,
        "decay_steps": 35,
        "min_lr_ratio": pytest.approx(0.1),
    }
    assert cfg["checkpointing"]["save_period"] == 20  # val_period 20


@pytest.mark.parametrize(
    ("items", "section", "kind"),
    [
        (None, {"name": "constant", "warmup_steps": 0}, "renamed"),
        (
            [{"name": "torch.optim.lr_scheduler.ConstantLR", "kwargs": {"factor": 1.0}}],
            {"name": "constant", "warmup_steps": 0},
            "renamed",
        ),
        (
            [{"name": "torch.optim.lr_scheduler.CosineAnnealingLR", "kwargs": {"T_max": 9}}],
            {"name": "cosine", "warmup_steps": 0, "decay_steps": 9, "min_lr_ratio": 0.0},
            "renamed",
        ),
        (
            [
                {
                    "name": "torch.optim.lr_scheduler.LinearLR",
                    "kwargs": {"start_factor": 0.5, "total_iters": 3},
                },
                {
                    "name": "torch.optim.lr_scheduler.LinearLR",
                    "kwargs": {"start_factor": 1.0, "end_factor": 0.2, "total_iters": 7},
                },
                {"milestones": [3]},
            ],
            {"name": "linear", "warmup_steps": 3, "decay_steps": 7, "min_lr_ratio": 0.2},
            "changed",
        ),
        (
            [{"name": "torch.optim.lr_scheduler.StepLR", "kwargs": {"step_size": 5}}],
            {"name": "constant", "warmup_steps": 0},
            "changed",
        ),
    ],
)
def test_torch_schedules(items, section, kind):
    schedule = convert_torch_schedule(items, 1e-3)
    assert (schedule.section, schedule.kind) == (section, kind)


def test_megatron_schedules():
    schedule = convert_megatron_schedule(
        {"lr_decay_style": "linear", "lr_warmup_iters": 0, "lr_decay_iters": 100},
        {"lr": 1e-4, "min_lr": 1e-5},
    )
    assert schedule.section == {
        "name": "linear",
        "warmup_steps": 0,
        "decay_steps": 100,
        "min_lr_ratio": pytest.approx(0.1),
    }
    assert schedule.kind == "renamed"
    odd = convert_megatron_schedule({"lr_decay_style": "WSD"}, {"lr": 1e-4})
    assert odd.section["name"] == "constant" and odd.kind == "changed"


def test_bad_input_exits_2(tmp_path, capsys):
    assert main(["nemo-rl", str(tmp_path / "absent.yaml"), "-o", str(tmp_path / "o.yaml")]) == 2
    assert capsys.readouterr().err.startswith("error: config file not found")
    assert main(["nemo-rl", str(DTENSOR), "-o", str(DTENSOR)]) == 2
    assert "is the NeMo-RL config itself" in capsys.readouterr().err


def test_an_unknown_dataset_is_written_and_named(tmp_path, capsys):
    child = tmp_path / "child.yaml"
    child.write_text(f"defaults: {DTENSOR}\ndata:\n  train:\n    dataset_name: OpenMathInstruct2\n")
    out = tmp_path / "out.yaml"
    assert main(["nemo-rl", str(child), "-o", str(out)]) == 2
    captured = capsys.readouterr()
    assert (
        out.exists() and "NeMo-RL's registry name 'OpenMathInstruct2' is not known" in captured.out
    )
    assert "does not load yet" in captured.err
    assert "data.dataset_name and data.train_path are both null" in captured.err


def test_a_model_parallel_group_larger_than_a_node_is_fitted(tmp_path, capsys):
    child = tmp_path / "two_nodes.yaml"
    child.write_text(
        f"defaults: {DTENSOR}\nteacher:\n  dtensor_cfg: {{context_parallel_size: 2}}\n"
        "cluster: {num_nodes: 2, gpus_per_node: 4}\n"
    )
    cfg, printed = converted(tmp_path, child, capsys)
    assert cfg["teacher"]["dtensor_cfg"]["tensor_parallel_size"] == 4
    assert cfg["teacher"]["dtensor_cfg"]["context_parallel_size"] == 1
    assert "stays inside one node of 4 here" in " ".join(printed.split())


def test_the_docs_key_map_is_the_generated_one():
    from nemo_opd.convert.report import markdown_key_map

    docs = (Path(__file__).resolve().parents[3] / "docs" / "nemo_rl.md").read_text()
    begin = "<!-- key map: generated by `python -m nemo_opd.convert key-map`; do not edit -->\n"
    written = docs[docs.index(begin) + len(begin) : docs.index("<!-- end of key map -->")]
    assert written == markdown_key_map(), "regenerate docs/nemo_rl.md's key map"


def test_w_and_b_stays_on_only_where_wandb_is_installed(tmp_path, capsys):
    import importlib.util

    child = tmp_path / "wandb.yaml"
    child.write_text(f"defaults: {DTENSOR}\nlogger: {{wandb_enabled: true}}\n")
    cfg, printed = converted(tmp_path, child, capsys)
    installed = importlib.util.find_spec("wandb") is not None
    assert cfg["logger"]["wandb_enabled"] is installed
    assert ("wandb is not installed here" in printed) is not installed


def test_a_list_of_training_sets_converts_its_first(tmp_path, capsys):
    child = tmp_path / "two_sets.yaml"
    child.write_text(
        f"defaults: {DTENSOR}\ndata:\n  train:\n    - {{dataset_name: DeepScaler}}\n"
        "    - {data_path: more.jsonl}\n"
        "logger: {wandb: {name: two-sets}, tensorboard: {log_dir: tb}}\n"  # not data.train.*
    )
    cfg, printed = converted(tmp_path, child, capsys)
    assert cfg["data"]["dataset_name"] == "agentica-org/DeepScaleR-Preview-Dataset"
    assert "train_path" not in cfg["data"]
    assert "one dataset per split here: the first is used" in printed
