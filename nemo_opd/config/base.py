"""The base class every configuration section derives from."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    """A configuration section: unknown keys are rejected, field docstrings become descriptions.

    Every section is its own model so a component can be handed only the section it needs
    (`Policy(cfg.policy)`, `topk_kl(..., **cfg.loss_fn.model_dump())`).
    """

    model_config = ConfigDict(
        extra="forbid",
        use_attribute_docstrings=True,
        validate_assignment=True,
        protected_namespaces=(),
    )
