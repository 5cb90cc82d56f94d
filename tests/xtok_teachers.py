"""Teachers for the cross-tokenizer tests that a render worker can run too (the pool pickles
them to its worker processes, which import this module: tests put this folder on PYTHONPATH),
and the conversations those tests score.

PositionTeacher answers exactly, from each position alone (CountingTeacher also counts the
rows it scored); the others fail as a worker's teacher can: StuckTeacher never answers,
DyingTeacher's process dies.
"""

import os
import signal
import time

import torch
from real_tokenizers import HOSTILE_TEXTS

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores

K = 16
LEVELS = torch.log_softmax(torch.randn(K + 1, generator=torch.Generator().manual_seed(0)), -1)
LEVELS = LEVELS[:K].sort(descending=True).values  # the last slot's mass: the tail


class PositionTeacher:
    """A teacher whose answer at a position is a function of that position and its tokens only
    (never of the other rows or the batch's width), in exact float arithmetic: slot 0 is the
    next token (a chain's tokens are found in the top-k), the rest ids spread over the
    vocabulary; log-probs the same descending levels, shifted by the position."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        ids, lengths = rollouts.batch["input_ids"], rollouts.batch["input_lengths"]
        positions = torch.arange(ids.shape[1])
        past = positions >= lengths.unsqueeze(1)  # 0 there, as the engines answer
        spread = ids.unsqueeze(-1) * 7919 + torch.arange(K) * 104729 + positions.unsqueeze(-1)
        indices = (spread % self.vocab_size).to(torch.int32)
        indices[..., 0] = ids.roll(-1, dims=1).to(torch.int32)
        values = LEVELS - (positions % 3).unsqueeze(-1) * 0.25
        values = values.expand(*ids.shape, K).masked_fill(past.unsqueeze(-1), 0.0)
        sampled = -((ids * 13 + positions) % 17).float() / 8
        return TeacherScores(
            topk_logprobs=values if need.topk else None,
            topk_indices=indices.masked_fill(past.unsqueeze(-1), 0) if need.topk else None,
            logprobs=sampled.masked_fill(past, 0.0) if need.sampled else None,
        )

    def take_metrics(self) -> dict[str, float]:
        return {}

    def shutdown(self) -> None:
        pass

    def longest_wait_s(self, rows: int) -> float:
        return 0.0


class CountingTeacher(PositionTeacher):
    """PositionTeacher, counting the rows it scored in its metrics (teacher/rows_scored)."""

    def __init__(self, vocab_size: int) -> None:
        super().__init__(vocab_size)
        self.rows = 0

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        self.rows += rollouts.batch["input_ids"].shape[0]
        return super().score(rollouts, need)

    def take_metrics(self) -> dict[str, float]:
        rows, self.rows = self.rows, 0
        return {"teacher/rows_scored": float(rows)}


class StuckTeacher(PositionTeacher):
    """Never answers (a server that stalls without failing)."""

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        time.sleep(3600)
        raise AssertionError("unreachable")


class DyingTeacher(PositionTeacher):
    """Its process dies while scoring (as the kernel's out-of-memory killer ends one)."""

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        os.kill(os.getpid(), signal.SIGKILL)
        raise AssertionError("unreachable")


def conversations(student) -> list[list[dict]]:
    """A row per hostile text, a row of two turns, a response cut mid-character and a row
    Mistral's template refuses (two user turns in a row): 13 rows."""
    formatter = ChatFormatter(student)

    def turn(text, cut=0):
        ids = student(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ids = ids[:-cut] if cut else [*ids, student.eos_token_id]
        return {"role": "assistant", "content": text, "token_ids": ids, "generation_logprobs": []}

    opening = formatter.prompt_log("What is 7 * 6?")
    logs = [[*opening, turn(text)] for text in HOSTILE_TEXTS]
    first = [*opening, turn(HOSTILE_TEXTS[7])]
    logs.append(formatter.extend(first, [{"role": "user", "content": "And 6 * 7?"}]))
    logs[-1].append(turn(HOSTILE_TEXTS[3]))
    logs.append([*opening, turn("The answer is 4🎉", cut=1)])
    again = {"role": "user", "content": "again", "token_ids": [16, 17]}
    logs.append([*opening, again, turn("Four.")])
    return logs
