"""Turn a validated config back into plain data or YAML (for printing and saving)."""

from typing import Any

import yaml
from pydantic import BaseModel


def to_dict(cfg: BaseModel) -> dict[str, Any]:
    """The config (or any section) as plain JSON-compatible data, every default filled in."""
    return cfg.model_dump(mode="json")


def to_yaml(cfg: BaseModel) -> str:
    """The config (or any section) as YAML that load_config reads back to an equal config."""
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, default_flow_style=False, width=100)
