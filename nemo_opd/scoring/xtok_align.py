"""Aligning two tokenizations of the same text by byte offsets, for a teacher with another
tokenizer.

The student sampled token ids; the teacher reads the same text in its own tokens. Each token
is placed on the text's bytes by its own bytes (nemo_opd.scoring.xtok_vocab.token_bytes):
token j of a sequence covers [starts[j], starts[j + 1]) where `starts` is the running sum of the
token lengths. This holds for any ids, not only those the tokenizer would choose, and for a
token that ends inside a multi-byte character (byte-level BPEs split characters over several
ids): a character is never assigned to a token by decoding.

- A student token that starts at the byte where a teacher token starts has a teacher
  distribution: the teacher's next-token distribution at that point, over texts that continue
  the same bytes (`sources`). One that starts inside a teacher token has none.
- Where both tokenizations have a boundary at the same byte they agree; between two such
  boundaries lies a group of one or more tokens on each side (`group_ids`). The teacher's
  log-probability of a group's text is the sum of its tokens' log-probs (the chain rule).

A teacher whose tokenizer normalizes the text (Qwen's NFC) reads other bytes than the student
wrote wherever normalization changes them; its tokens are then placed by the tokenizer's
offsets into the student's text (`char_starts`), at whole characters only.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

INSIDE = -1
"""A token start that is no boundary (a teacher token that starts inside a character of the
student's text, after normalization)."""


def running_starts(lengths: Sequence[int]) -> np.ndarray:
    """[n + 1] int64: the byte where each of n tokens of these byte lengths starts, then the
    end."""
    starts = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(np.asarray(lengths, dtype=np.int64), out=starts[1:])
    return starts


def char_starts(offsets: Sequence[tuple[int, int]], text: str) -> np.ndarray:
    """[n + 1] int64: the byte of `text` where each token starts, from a tokenizer's character
    offsets (into the text before its normalization), INSIDE for a token that starts at the
    same character as the one before it (the rest of a character split over several tokens),
    then the text's byte length."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (points >= 0x80) + (points >= 0x800) + (points >= 0x10000)
    char_bytes = running_starts(widths)
    firsts = np.asarray([start for start, _ in offsets], dtype=np.int64)
    starts = np.empty(len(firsts) + 1, dtype=np.int64)
    starts[-1] = char_bytes[-1]
    starts[:-1] = char_bytes[firsts]
    repeated = np.zeros(len(firsts), dtype=bool)
    repeated[1:] = firsts[1:] == firsts[:-1]
    starts[:-1][repeated] = INSIDE
    return starts


def sources(student: np.ndarray, teacher: np.ndarray) -> np.ndarray:
    """[n_s] int64: for each student token (its start in `student`, [n_s + 1] with the end),
    the index of the teacher token that starts at the same byte, or -1. `teacher` is [n_t + 1]
    (starts then the end); INSIDE starts and teacher tokens of no bytes never match (the next
    one starting there does), nor do student tokens of no bytes."""
    firsts = teacher[:-1]
    real = (firsts != INSIDE) & (filled_ends(teacher) > firsts)
    keys, index = firsts[real], np.flatnonzero(real)
    out = np.full(len(student) - 1, -1, dtype=np.int64)
    if len(keys) == 0:
        return out
    at = np.searchsorted(keys, student[:-1]).clip(max=len(keys) - 1)
    found = (keys[at] == student[:-1]) & (student[1:] > student[:-1])
    out[found] = index[at[found]]
    return out


def group_ids(student: np.ndarray, teacher: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([n_s], [n_t]) int64: the group of each token, groups cut at the bytes where both sides
    end a token (the tokens after the last common end form a last group)."""
    t_ends = filled_ends(teacher)
    common = np.intersect1d(student[1:], t_ends)
    s_group = np.searchsorted(common, student[1:], side="left")
    t_group = np.searchsorted(common, t_ends, side="left")
    return s_group, t_group


def filled_ends(starts: np.ndarray) -> np.ndarray:
    """[n] each token's end: the next start, or where that is INSIDE the first real start after
    it (the token ends inside a character, with the tokens that complete it)."""
    ends = starts[1:]
    big = np.where(ends == INSIDE, np.iinfo(np.int64).max, ends)
    return np.minimum.accumulate(big[::-1])[::-1]


def spread_over_groups(
    s_group: np.ndarray, t_group: np.ndarray, teacher_logprobs: np.ndarray
) -> np.ndarray:
    """[n_s] float: each student token's share of its group's teacher log-probability (the sum
    over the group's teacher tokens, split evenly over its student tokens)."""
    groups = int(max(s_group.max(initial=-1), t_group.max(initial=-1))) + 1
    sums = np.bincount(t_group, weights=teacher_logprobs, minlength=groups)
    counts = np.bincount(s_group, minlength=groups)
    return sums[s_group] / np.maximum(counts[s_group], 1)
