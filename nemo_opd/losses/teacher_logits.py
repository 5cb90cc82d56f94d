"""The teacher's logits for the full-vocabulary loss, handed over as rows on demand.

The full-vocabulary divergence (full_vocab.py) walks its positions in blocks of a few rows. Its
teacher logits may be a tensor, or be made from the teacher's hidden states with the teacher's
LM head as each block is reached (the engine does that: policy/engines/teacher_head.py), so that
not even one chunk's [C, V] of teacher logits is alive at once, only a block's.

    teacher = TeacherLogits.of(logits)                         # [..., V_local] tensor
    teacher = TeacherLogits.from_hidden(hidden, head_logits)   # [..., H_T] and a function
    block = teacher.rows(0, 32)                                # [32, V_local]
"""

from collections.abc import Callable

import torch


class TeacherLogits:
    """Rows [R, V_local] of the teacher's logits over the flattened positions.

    Args:
        make: make(start, end) -> the logits of flattened positions start..end-1.
        lead: the positions' shape.
        vocab_local: columns (this rank's vocabulary shard).
    """

    def __init__(self, make: Callable[[int, int], torch.Tensor], lead, vocab_local: int) -> None:
        self.make = make
        self.shape = torch.Size((*lead, vocab_local))

    @classmethod
    def of(cls, logits: "torch.Tensor | TeacherLogits") -> "TeacherLogits":
        """Logits given as a tensor [..., V_local] (or already a TeacherLogits)."""
        if isinstance(logits, TeacherLogits):
            return logits
        flat = logits.detach().reshape(-1, logits.shape[-1])
        return cls(lambda start, end: flat[start:end], logits.shape[:-1], logits.shape[-1])

    @classmethod
    def from_hidden(
        cls, hidden: torch.Tensor, head: Callable[[torch.Tensor], torch.Tensor], vocab_local: int
    ) -> "TeacherLogits":
        """Logits made from hidden states [..., H_T] by head([R, H_T]) -> [R, V_local]."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        return cls(lambda start, end: head(flat[start:end]), hidden.shape[:-1], vocab_local)

    def rows(self, start: int, end: int) -> torch.Tensor:
        """[end - start, V_local] logits of flattened positions start..end-1 (no gradient)."""
        with torch.no_grad():
            return self.make(start, end)
