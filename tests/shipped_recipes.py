"""The shipped recipes (examples/configs) as tests load them: a recipe that leaves keys to the
user's own config (`???` there) is loaded with stand-ins for them."""

from pathlib import Path

from nemo_opd.config import DistillationConfig, load_config

CONFIGS = Path(__file__).resolve().parents[1] / "examples" / "configs"

OWN_MODEL_KEYS = [
    "policy.model_name=/models/student",
    "teacher.model_name=/models/teacher",
    "data.train_path=/data/train.jsonl",
    "data.val_path=/data/val.jsonl",
]
"""The keys own_model_cpu.yaml leaves to the user's config (??? there)."""

SET_BY_THE_USER = {"own_model_cpu.yaml": OWN_MODEL_KEYS}


def load_recipe(path: Path, overrides: list[str] | None = None) -> DistillationConfig:
    """A shipped recipe with the user's keys stood in for, then `overrides`."""
    return load_config(path, [*SET_BY_THE_USER.get(path.name, []), *(overrides or [])])
