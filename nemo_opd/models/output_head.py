"""The output head: how each model family turns final hidden states into logits.

Most causal LMs compute logits = h W^T, with W the LM head's rows or, with tied embeddings, the
input embedding's. Some families add a step after the product, which Hugging Face's forward
applies and which every path that multiplies by W itself (the chunked head of the student's
loss and scoring, the teacher's top-k and log-probs, the teacher's head under support full)
must apply too:

    family                                  logits
    llama mistral mixtral qwen2 qwen2_moe   h W^T
    qwen3 qwen3_moe gemma phi3 olmo2
    phi                                     h W^T + b                 (the LM head's bias)
    granite granitemoe                      (h W^T) / logits_scaling
    cohere cohere2                          (h W^T) * logit_scale
    gemma2 gemma3_text                      cap * tanh((h W^T) / cap), cap = final_logit_softcapping

A head is applied in two parts, so that the chunked head can form the product's gradients by
hand and leave the rest to autograd:

    raw = head.project(h [C, H], W [V_local, H], b [V_local] or None)   # the linear part
    logits = head.transform(raw)                                         # elementwise

Every step after the product is elementwise, so under tensor parallelism each rank applies it
to its own vocabulary shard (W and b hold that shard's rows). The operations and their order
are Hugging Face's, so a head computes what the model's own forward computes; the plain head's
transform is no operation at all.

output_head_of(config) builds a family's head from its Hugging Face config, and raises
UnknownHeadError for a model_type it does not know and for a config that carries a logit step
its family's head does not apply: a head it cannot reproduce is refused, never guessed. Which
families those are (read from the config alone, without torch): head_families.py.
"""

from dataclasses import dataclass

import torch
from transformers import PretrainedConfig

from nemo_opd.models.head_families import head_fields


@dataclass(frozen=True)
class OutputHead:
    """One family's output head: the product (with the LM head's bias when `biased`) and the
    elementwise steps after it, in Hugging Face's order (divide, multiply, soft-cap)."""

    family: str = "plain"
    """The model_type it was built for."""
    tied: bool = False
    """W is the input embedding's rows (tie_word_embeddings)."""
    biased: bool = False
    """The LM head adds a bias b [V]."""
    divide_by: float | None = None
    """Granite's logits_scaling: logits = raw / divide_by."""
    multiply_by: float | None = None
    """Cohere's logit_scale: logits = raw * multiply_by."""
    softcap: float | None = None
    """Gemma 2/3's final_logit_softcapping: logits = cap * tanh(raw / cap)."""

    @property
    def is_plain(self) -> bool:
        """logits = h W^T exactly: no bias and no step after the product."""
        return not self.biased and not self.has_transform

    @property
    def has_transform(self) -> bool:
        """Whether anything follows the product (transform is not the identity)."""
        return (self.divide_by, self.multiply_by, self.softcap) != (None, None, None)

    @property
    def weight_names(self) -> tuple[str, ...]:
        """Where a Hugging Face checkpoint of the family keeps W."""
        return ("model.embed_tokens.weight",) if self.tied else ("lm_head.weight",)

    @property
    def bias_name(self) -> str | None:
        """Where a checkpoint keeps b (None: the head has none)."""
        return "lm_head.bias" if self.biased else None

    def project(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The linear part: hidden [C, H] x rows [V_local, H] (+ bias [V_local]) ->
        raw [C, V_local], in the inputs' precision."""
        return torch.nn.functional.linear(hidden, weight, bias)

    def transform(self, raw: torch.Tensor) -> torch.Tensor:
        """The elementwise steps after the product, raw [..., V_local] -> logits (raw itself
        for a head without any); differentiable."""
        logits = raw
        if self.divide_by is not None:
            logits = logits / self.divide_by
        if self.multiply_by is not None:
            logits = logits * self.multiply_by
        if self.softcap is not None:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def logits(
        self, hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """transform(project(hidden, weight, bias)): [C, H] -> [C, V_local]."""
        return self.transform(self.project(hidden, weight, bias))


PLAIN_HEAD = OutputHead()
"""logits = h W^T."""


def output_head_of(config: PretrainedConfig) -> OutputHead:
    """The output head of the model whose Hugging Face config is `config`.

    Raises:
        UnknownHeadError: the model_type is not a known family, or the config sets a logit
            step (LOGIT_STEPS) that its family's head does not apply (head_families.py).
    """
    family, fields = head_fields(config)
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return OutputHead(family=family, tied=tied, **fields)
