"""The teacher's logits for the full-vocabulary loss, handed over as rows on demand.

The full-vocabulary divergence (full_vocab.py) walks its positions in blocks of a few rows. Its
teacher logits may be a tensor, or be made from the teacher's hidden states with the teacher's
LM head (the engine does that: policy/engines/teacher_head.py). Made ones are made a slab of
rows at a time, in one [R, H_T] x [H_T, V_local] product of up to SLAB_ELEMENTS logits, and the
loss's blocks are sliced from the slab: at Qwen3's 151,936 ids a chunk of 256 positions is one
product, where one product per block of the loss (27 rows) read the whole head again about ten
times per chunk (a GEMM of 27 rows is bound by reading the head, not by its arithmetic). One
slab is alive at a time, never [N, V] of teacher logits.

    teacher = TeacherLogits.of(logits)                         # [..., V_local] tensor
    teacher = TeacherLogits.from_hidden(hidden, head_logits)   # [..., H_T] and a function
    block = teacher.rows(0, 32)                                # [32, V_local]
"""

from collections.abc import Callable

import torch

SLAB_ELEMENTS = 2**26
"""Teacher logits per product of its head (256 MiB in fp32, 128 MiB in bf16): 441 rows at
151,936 ids, so a chunk of 256 positions (policy.logits_chunk_tokens' default) is one."""


class TeacherLogits:
    """Rows [R, V_local] of the teacher's logits over the flattened positions.

    Args:
        make: make(start, end) -> the logits of flattened positions start..end-1.
        lead: the positions' shape.
        vocab_local: columns (this rank's vocabulary shard).
        slab_rows: rows made at once (a request inside the slab last made is sliced from it);
            None: each request is made as asked.
    """

    def __init__(
        self,
        make: Callable[[int, int], torch.Tensor],
        lead,
        vocab_local: int,
        slab_rows: int | None = None,
    ) -> None:
        self.make = make
        self.shape = torch.Size((*lead, vocab_local))
        self.positions = self.shape[:-1].numel()
        self.slab_rows = slab_rows
        self._slab: torch.Tensor | None = None
        self._slab_start = 0

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
        """Logits made from hidden states [..., H_T] by head([R, H_T]) -> [R, V_local], a slab
        of SLAB_ELEMENTS // V_local rows per call of head."""
        flat = hidden.reshape(-1, hidden.shape[-1])
        slab_rows = max(1, SLAB_ELEMENTS // max(vocab_local, 1))
        return cls(
            lambda start, end: head(flat[start:end]), hidden.shape[:-1], vocab_local, slab_rows
        )

    def rows(self, start: int, end: int) -> torch.Tensor:
        """[end - start, V_local] logits of flattened positions start..end-1 (no gradient)."""
        with torch.no_grad():
            if self.slab_rows is None:
                return self.make(start, end)
            if not self._slab_holds(start, end):
                self._slab = None  # the last slab freed before the next is made
                stop = min(max(end, start + self.slab_rows), self.positions)
                self._slab, self._slab_start = self.make(start, stop), start
            offset = start - self._slab_start
            return self._slab[offset : offset + end - start]

    def _slab_holds(self, start: int, end: int) -> bool:
        """Whether the slab last made holds positions start..end-1."""
        if self._slab is None:
            return False
        return self._slab_start <= start and end <= self._slab_start + len(self._slab)
