"""What a teacher is asked and what it answers: the rollouts it scores (Rollouts), what the
loop needs of it (TeacherNeed) and its scores in the student's positions (TeacherScores).

The teachers (nemo_opd.teachers) take and give these; so do the policy's workers, which score
a teacher's rows in their own process (nemo_opd.policy.worker), so they stand below both.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.message_log import Message


@dataclass(frozen=True)
class TeacherNeed:
    """What the loop needs from a teacher."""

    topk: int = 0
    """k: the top-k log-probs and ids of every position (0: none)."""
    sampled: bool = False
    """The log-prob of the token at every next position."""
    temperature: float = 1.0
    """The teacher's temperature."""
    hidden: bool = False
    """The final hidden states of every position (the full-vocabulary divergence: the
    student's engine applies the teacher's LM head)."""
    trained_only: bool = False
    """The top-k, the log-probs and the hidden states are read only where the next token is
    trained (the batch's token_mask at t + 1: the loss mask's positions): a teacher may leave
    the others 0, skip their LM head and not send them (InProcessTeacher does both; a served
    teacher computes them all)."""


@dataclass
class Rollouts:
    """The rollouts a teacher scores."""

    batch: TensorBatch
    """The student's rows: input_ids [B, S], input_lengths [B] (and the masks)."""
    message_logs: list[list[Message]]
    """The conversation of each row."""
    metadata: list[dict]
    """Each row's record fields and environment state ("teacher" names its route)."""

    def select(self, rows: torch.Tensor) -> Rollouts:
        """The rollouts of the given row indices [n], in that order."""
        picked = rows.tolist()
        return Rollouts(
            self.batch.select(rows),
            [self.message_logs[i] for i in picked],
            [self.metadata[i] for i in picked],
        )


@dataclass
class TeacherScores:
    """A teacher's answer, in the student's positions; None where not asked for."""

    topk_logprobs: torch.Tensor | None = None
    """[B, S, k] fp32."""
    topk_indices: torch.Tensor | None = None
    """[B, S, k] int32."""
    logprobs: torch.Tensor | None = None
    """[B, S] fp32."""
    hidden_states: torch.Tensor | None = None
    """[B, S, H_T] in the teacher's compute precision."""

    def tensors(self) -> dict[str, torch.Tensor]:
        """The tensors present, by field name."""
        fields = {
            "topk_logprobs": self.topk_logprobs,
            "topk_indices": self.topk_indices,
            "logprobs": self.logprobs,
            "hidden_states": self.hidden_states,
        }
        return {name: value for name, value in fields.items() if value is not None}
