"""Where nemo_opd keeps what it builds once and reuses across runs: the tiny task's models and
data (nemo_opd.tiny.assets) and the prompts' token ids (nemo_opd.data.prompt_cache)."""

import os
from pathlib import Path

CACHE_ENV = "NEMO_OPD_CACHE"


def cache_root() -> Path:
    """``$NEMO_OPD_CACHE`` if set, else ``~/.cache/nemo_opd``, as an absolute path (workers on
    other nodes, or in another working directory, load the models from it)."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "nemo_opd").absolute()
