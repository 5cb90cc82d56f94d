"""The teacher's LM head, held by the student's engine for the full-vocabulary divergence.

With loss_fn.support "full" or "student_topk" the teacher sends its final hidden states h_T
[B, S, H_T] (after its last norm: what its LM head reads) instead of its top-k, and the
student's engine turns them into the teacher's logits chunk by chunk, next to its own, inside
the chunked LM head (docs/loss.md, "The full vocabulary"):

    z_T = cap * tanh(h_T W_T^T / cap)     (cap: the model's final_logit_softcapping, if any)

W_T is frozen and held like the student's output layer: padded to the engine's padded
vocabulary, and this tensor-parallel rank's shard of its rows only, in the teacher's precision.
"""

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from nemo_opd.policy.engines.vocab_padding import resize_vocab_rows

OUTPUT_NAMES = ("lm_head.weight", "model.embed_tokens.weight")
"""Where a Hugging Face causal LM keeps its output rows: its own head, or (tied) the input
embedding."""


@dataclass
class TeacherHead:
    """This rank's rows of the teacher's LM head and the model's logit soft-cap."""

    weight: torch.Tensor
    """[V_pad / tp, H_T] in the teacher's precision, no gradient."""
    softcap: float | None
    """final_logit_softcapping of the teacher's config (None: none)."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H_T] teacher hidden states -> [..., V_pad / tp] logits (padding unmasked)."""
        z = torch.nn.functional.linear(hidden.to(self.weight.dtype), self.weight)
        if self.softcap:
            z = torch.tanh(z / self.softcap) * self.softcap
        return z


def read_output_weight(model_dir: str | Path) -> tuple[torch.Tensor, float | None]:
    """(the output rows [V, H] of a Hugging Face causal LM saved in model_dir, its logit
    soft-cap), read from its safetensors files (one file or an index of shards)."""
    root = Path(model_dir)
    config = json.loads((root / "config.json").read_text())
    tied = config.get("tie_word_embeddings", False)
    files = _weight_files(root)
    names = OUTPUT_NAMES[1:] if tied else OUTPUT_NAMES
    for name in names:
        for path in files:
            with safe_open(str(path), framework="pt") as handle:
                if name in handle.keys():  # noqa: SIM118 (safe_open has no __contains__)
                    return handle.get_tensor(name), config.get("final_logit_softcapping")
    raise ValueError(
        f"{root}: none of {list(names)} in its weights: the teacher's LM head cannot be read "
        "(loss_fn.support full and student_topk need it)"
    )


def load_teacher_head(
    model_dir: str | Path,
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
    weight, softcap = read_output_weight(model_dir)
    if weight.shape[0] != vocab_size:
        raise ValueError(
            f"the teacher's LM head has {weight.shape[0]} rows and the student's vocabulary "
            f"{vocab_size} ids: loss_fn.support full and student_topk compare the two "
            "distributions id by id and need one vocabulary (use support teacher_topk)"
        )
    shard = resize_vocab_rows(weight, padded_rows).chunk(tp)[tp_rank]
    return TeacherHead(shard.to(device=device, dtype=dtype).contiguous(), softcap)


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / name for name in shards]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{root}: no safetensors weights to read the teacher's LM head from")
    return files
