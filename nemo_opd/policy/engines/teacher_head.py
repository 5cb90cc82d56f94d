"""The teacher's LM head, held by the student's engine for the full-vocabulary divergence.

With loss_fn.support "full" or "student_topk" the teacher sends its final hidden states h_T
[B, S, H_T] (after its last norm: what its LM head reads) instead of its top-k, and the
student's engine turns them into the teacher's logits chunk by chunk, next to its own, inside
the chunked LM head (docs/loss.md, "The full vocabulary"), with the teacher's own output head
(nemo_opd/models/output_head.py: its bias, scale or soft-cap as its family applies them):

    z_T = head.transform(h_T W_T^T + b_T)

W_T (and b_T) are frozen and held like the student's output layer: padded to the engine's
padded vocabulary, and this tensor-parallel rank's shard of its rows only, in the teacher's
precision. The teacher is named as its engines name it, a local folder or a hub name (resolved
through the Hugging Face cache, downloading only the file that holds the head).
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig
from transformers.utils.hub import cached_file

from nemo_opd.models.output_head import OutputHead, output_head_of
from nemo_opd.policy.engines.vocab_padding import resize_vocab_rows

SAFETENSORS_INDEX = "model.safetensors.index.json"
SAFETENSORS_SINGLE = "model.safetensors"


@dataclass
class TeacherHead:
    """This rank's rows of the teacher's LM head and the teacher's output head."""

    weight: torch.Tensor
    """[V_pad / tp, H_T] in the teacher's precision, no gradient."""
    bias: torch.Tensor | None
    """[V_pad / tp] the head's bias (None: the family's head has none)."""
    head: OutputHead
    """The teacher family's transform (scale, soft-cap) after the product."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H_T] teacher hidden states -> [..., V_pad / tp] logits (padding unmasked)."""
        return self.head.logits(hidden.to(self.weight.dtype), self.weight, self.bias)


def read_output_head(
    model_name: str | Path,
) -> tuple[OutputHead, torch.Tensor, torch.Tensor | None]:
    """(the output head, its rows W [V, H], its bias [V] or None) of the Hugging Face causal LM
    `model_name` (a local folder or a hub name), read from its safetensors weights (one file or
    an index of shards: only the shard holding each tensor is opened).

    Raises ValueError when the weights do not hold them, UnknownHeadError (a ValueError) for a
    model whose head nemo_opd does not reproduce.
    """
    head = output_head_of(AutoConfig.from_pretrained(str(model_name)))
    weight = _read_tensor(str(model_name), head.weight_names)
    bias = _read_tensor(str(model_name), (head.bias_name,)) if head.biased else None
    return head, weight, bias


def load_teacher_head(
    model_name: str | Path,
    vocab_size: int,
    padded_rows: int,
    tp: int,
    tp_rank: int,
    device: torch.device,
    dtype: torch.dtype,
) -> TeacherHead:
    """This rank's shard of the teacher's LM head, padded like the student's output layer.

    Raises ValueError when the teacher's vocabulary is not the student's (vocab_size ids):
    the full-vocabulary divergence compares the two models id by id.
    """
    head, weight, bias = read_output_head(model_name)
    if weight.shape[0] != vocab_size:
        raise ValueError(
            f"the teacher's LM head has {weight.shape[0]} rows and the student's vocabulary "
            f"{vocab_size} ids: loss_fn.support full and student_topk compare the two "
            "distributions id by id and need one vocabulary (use support teacher_topk)"
        )

    def shard(tensor: torch.Tensor) -> torch.Tensor:
        rows = resize_vocab_rows(tensor, padded_rows).chunk(tp)[tp_rank]
        return rows.to(device=device, dtype=dtype).contiguous()

    return TeacherHead(shard(weight), shard(bias) if bias is not None else None, head)


def _read_tensor(model_name: str, names: tuple[str, ...]) -> torch.Tensor:
    """The first of `names` that the model's safetensors weights hold."""
    index = _model_file(model_name, SAFETENSORS_INDEX)
    if index is not None:
        weight_map = json.loads(Path(index).read_text())["weight_map"]
        holders = [(name, weight_map[name]) for name in names if name in weight_map]
    else:
        holders = [(name, SAFETENSORS_SINGLE) for name in names]
    for name, file_name in holders:
        path = _model_file(model_name, file_name)
        if path is None:
            continue
        with safe_open(path, framework="pt") as handle:
            if name in handle.keys():  # noqa: SIM118 (safe_open has no __contains__)
                return handle.get_tensor(name)
    raise ValueError(
        f"{model_name}: none of {list(names)} in its safetensors weights: the teacher's LM "
        "head cannot be read (loss_fn.support full and student_topk need it)"
    )


def _model_file(model_name: str, file_name: str) -> str | None:
    """The local path of one file of a model, found as from_pretrained finds it (in the
    folder, or through the Hugging Face cache for a hub name, downloaded when missing and not
    offline); None when the model has no such file."""
    try:
        return cached_file(model_name, file_name, _raise_exceptions_for_missing_entries=False)
    except OSError:  # a hub name without the file, or offline without it in the cache
        return None
