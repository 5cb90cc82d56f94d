"""NeMo-RL distillation configs for the tests: those written here in NeMo-RL's format
(tests/fixtures/nemo_rl), and NeMo-RL's published ones when its repository is on the machine.

The published configs are read from NEMO_RL_REPO (a checkout, or a bare git directory such
as a mirror); a test that wants them skips, saying why, when it is not set. They are copied
into a directory of the test's own with the checkout's layout, so that `defaults:` and the
relative prompt file resolve as they do in NeMo-RL.
"""

import os
import subprocess
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "nemo_rl"
FIXTURE_CONFIGS = sorted((FIXTURES / "examples" / "configs").rglob("*.yaml"))

PUBLISHED = (
    "examples/configs/distillation_math.yaml",
    "examples/configs/distillation_math_megatron.yaml",
    "examples/prompts/cot.txt",
)
PUBLISHED_RECIPES = "examples/configs/recipes/llm/distillation-qwen3-32b-"
"""The on-policy distillation recipes (the nvfp4 and cross-tokenizer off-policy recipes are
other algorithms: quantization-aware and off-policy distillation)."""


def nemo_rl_repo() -> Path | None:
    """NeMo-RL's repository (checkout or bare), or None."""
    named = os.environ.get("NEMO_RL_REPO")
    return Path(named) if named and Path(named).exists() else None


def published_configs(root: Path) -> list[Path]:
    """NeMo-RL's published distillation configs (DTensor, Megatron, the qwen3 recipes), copied
    under `root` with their prompt file; skips the calling test when the repository is absent."""
    repo = nemo_rl_repo()
    if repo is None:
        pytest.skip(
            "NeMo-RL's repository is not on this machine (set NEMO_RL_REPO to a checkout or a "
            "bare clone of NVIDIA-NeMo/RL); the configs written in its format "
            "(tests/fixtures/nemo_rl) still ran"
        )
    names = [*PUBLISHED, *[n for n in _list(repo) if n.startswith(PUBLISHED_RECIPES)]]
    for name in names:
        target = root / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(_read(repo, name))
    return [root / name for name in names if name.endswith(".yaml")]


def _is_bare(repo: Path) -> bool:
    return not (repo / "examples").exists()


def _list(repo: Path) -> list[str]:
    if not _is_bare(repo):
        return [str(p.relative_to(repo)) for p in (repo / "examples/configs").rglob("*.yaml")]
    listing = subprocess.run(
        ["git", "-C", str(repo), "ls-tree", "-r", "--name-only", "HEAD", "examples/configs"],
        capture_output=True,
        text=True,
        check=True,
    )
    return listing.stdout.split()


def _read(repo: Path, name: str) -> bytes:
    if not _is_bare(repo):
        return (repo / name).read_bytes()
    shown = subprocess.run(
        ["git", "-C", str(repo), "show", f"HEAD:{name}"], capture_output=True, check=True
    )
    return shown.stdout
