"""Which model families' output heads nemo_opd reproduces, read from a model's config alone
(its model_type and logit attributes): no torch, so that the command line's pre-flight can
refuse an unknown head before the loop's imports (algorithms/preflight.py). The heads
themselves, and the table of what each family adds to h W^T: output_head.py.

    family, fields = head_fields(config)   # config: a transformers config or config.json's keys
"""

from typing import Any


class UnknownHeadError(ValueError):
    """A model whose output head is not one of the known families'."""


STEPS = {
    "divide_by": "logits_scaling",
    "multiply_by": "logit_scale",
    "softcap": "final_logit_softcapping",
}
"""OutputHead's step fields and the config attribute each is read from."""

FAMILIES: dict[str, str | None] = {
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "mixtral",
            "qwen2",
            "qwen2_moe",
            "qwen3",
            "qwen3_moe",
            "gemma",
            "phi3",
            "olmo2",
        )
    ),
    "phi": "biased",
    "granite": "divide_by",
    "granitemoe": "divide_by",
    "cohere": "multiply_by",
    "cohere2": "multiply_by",
    "gemma2": "softcap",
    "gemma3_text": "softcap",
}
"""model_type -> what its head adds to h W^T (None: nothing; "biased", or a field of STEPS);
each is tested against the family's Hugging Face forward (tests/unit/models)."""

LOGIT_STEPS = {
    "logits_scaling": 1.0,
    "logit_scale": 1.0,
    "final_logit_softcapping": None,
    "lm_head_multiplier": 1.0,
    "output_multiplier_scale": 1.0,
}
"""Config attributes through which Hugging Face families scale or cap their logits, with the
value that changes nothing: a config whose family head does not read one that it sets to
anything else is refused."""

REFUSAL_HINTS = {
    "gemma3": "the image-text Gemma 3 (Gemma3ForConditionalGeneration) is not run by the "
    "engines; use a text-only checkpoint (model_type gemma3_text)",
}


def head_fields(config: Any) -> tuple[str, dict]:
    """(model_type, OutputHead's fields beyond family and tied) of the model whose config is
    `config` (a transformers config, or an object with config.json's keys as attributes).

    Raises:
        UnknownHeadError: the model_type is not a known family, or the config sets a logit
            step (LOGIT_STEPS) that its family's head does not apply.
    """
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        hint = REFUSAL_HINTS.get(model_type, f"use a model of a supported family ({known})")
        raise UnknownHeadError(
            f"model_type {model_type!r}: its output head (how its logits are made from the "
            f"hidden states) is not one nemo_opd reproduces; {hint}"
        )
    step = FAMILIES[model_type]
    fields: dict = {"biased": True} if step == "biased" else {}
    if step in STEPS and getattr(config, STEPS[step], None) is not None:
        fields[step] = float(getattr(config, STEPS[step]))
    for name, neutral in LOGIT_STEPS.items():
        value = getattr(config, name, neutral)
        if name != STEPS.get(step) and value != neutral:
            raise UnknownHeadError(
                f"model_type {model_type!r} sets {name}={value!r}, a logit step that "
                f"Hugging Face's {model_type} head does not take and nemo_opd does not "
                "apply; use a checkpoint of a supported family without it"
            )
    return model_type, fields
