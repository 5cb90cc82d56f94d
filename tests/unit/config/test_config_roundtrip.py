"""`--print-config` output loads back to the same config: every shipped config, and strings
that YAML would read as something else (numbers, booleans, nulls, dates, special characters)."""

from pathlib import Path

import pytest
from shipped_recipes import load_recipe

from nemo_opd.config import load_config, to_dict, to_yaml

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
TRICKY = [
    "1e5", "1E-3", "yes", "no", "on", "off", "null", "~", "true", "True", "0x10", "010", "1_000",
    "1:2", ".inf", "-.inf", ".nan", "2024-01-01", "", " padded ", "a: b", "#not a comment",
    "- a list?", "{x}", "[1]", "'quoted'", '"double"', "multi\nline", "tab\there", "é😀",
    "%d", "*alias", "&anchor", "!tag", "@at", "`tick`", "|", ">", "? key", "<|im_end|>",
]  # fmt: skip


def reloaded(tmp_path: Path, cfg) -> dict:
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(to_yaml(cfg), encoding="utf-8")
    return to_dict(load_config(dumped))


@pytest.mark.parametrize("config", sorted(p.name for p in CONFIGS.glob("*.yaml")))
def test_every_shipped_config_round_trips(tmp_path, config):
    cfg = load_recipe(CONFIGS / config)
    assert reloaded(tmp_path, cfg) == to_dict(cfg)


def test_strings_yaml_would_read_otherwise_stay_strings(tmp_path):
    cfg = load_config(CONFIGS / "distillation_tiny.yaml")
    cfg.policy.generation.stop_strings = TRICKY
    cfg.logger.wandb.name = "1e5"
    again = reloaded(tmp_path, cfg)
    assert again["policy"]["generation"]["stop_strings"] == TRICKY
    assert again["logger"]["wandb"]["name"] == "1e5"
    assert again == to_dict(cfg)
