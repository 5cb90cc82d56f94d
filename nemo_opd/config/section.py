"""The base of every configuration section (Section), and the upper bounds of sizes."""

from typing import Literal

from pydantic import BaseModel, ConfigDict

Precision = Literal["float32", "bfloat16", "float16"]

# Upper bounds of sizes (shown in docs/config.md): generous for any real run, and small enough
# that a typo (10^12 tokens) is refused when the config loads instead of when memory runs out.
MAX_TOKENS = 1 << 20  # a sequence, a generation, a vocabulary id count
MAX_MICROBATCH_TOKENS = 1 << 24  # a packed or dynamic microbatch
MAX_ROWS = 1 << 20  # sequences or prompts in a batch
MAX_RANKS = 1024  # nodes, workers per node, parallel sizes, CPUs
MAX_TURNS = 1024
MAX_STEPS = 10**9
MAX_STALENESS = 64  # steps of rollouts generated ahead of training (each holds a batch)
MAX_SEED = 2**32 - 1
MAX_SECONDS = 86_400


class Section(BaseModel):
    """A configuration section: unknown keys are rejected, field docstrings become descriptions,
    and every number must be finite (no inf or nan).

    Every section is its own model so a component can be handed only the section it needs
    (`Policy(cfg.policy)`, `DistillationLossFn.from_config(cfg.loss_fn)`).
    """

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
    )
