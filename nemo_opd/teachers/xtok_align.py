"""Aligning two tokenizations of the same text, for a teacher with another tokenizer.

The student sampled token ids; the teacher reads the same text in its own tokens. Both are
placed on the text's characters: the student's tokens by decoding (`token_spans`: the
characters each id adds, which holds for any ids, not only the tokenizer's own choice), the
teacher's from its tokenizer's offsets. Where both tokenizations have a boundary at the same
character they agree; between two such boundaries lies a group (`align_groups`): one or more
student tokens and one or more teacher tokens covering the same characters.

- A student token that starts where a teacher token starts has a teacher distribution: the
  teacher's next-token distribution at that point (`teacher_starts`). One that starts inside a
  teacher token has none (the teacher never stands at that point).
- The text of a group has a teacher log-probability, the sum of its teacher tokens' log-probs
  (the chain rule); `spread_over_groups` gives each student token of the group an equal share,
  so that a row's sum is the teacher's log-probability of the student's text.

Characters are Python str indices. A token that ends inside a multi-byte character (byte-level
tokenizers split one character over several ids) adds no character: it gets an empty span, at
the position where the token that completes the character starts.
"""

from __future__ import annotations

from collections.abc import Sequence

from transformers import PreTrainedTokenizerBase

CONTEXT_TOKENS = 4
"""Tokens decoded before each token when measuring what it adds: enough for tokenizers whose
decoder drops or adds a space at the start of a decode (SentencePiece's leading "▁")."""

Span = tuple[int, int]


def decode(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> str:
    """The text of `ids`, special tokens included and nothing cleaned up."""
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


def token_spans(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> tuple[str, list[Span]]:
    """(decode(ids), the [start, end) characters each id adds to it).

    Each token's characters are what decoding it after up to CONTEXT_TOKENS earlier tokens adds
    (O(n) decodes of a few tokens); when that does not reproduce the whole text (a decoder
    that rewrites earlier text), every prefix is decoded instead (O(n^2), exact).
    """
    text = decode(tokenizer, ids)
    spans = _windowed_spans(tokenizer, ids, text)
    return text, spans if spans is not None else _prefix_spans(tokenizer, ids)


def _windowed_spans(tokenizer, ids: Sequence[int], text: str) -> list[Span] | None:
    spans: list[Span] = []
    done = 0  # characters of text assigned so far
    pending = 0  # tokens since the last one that completed its characters
    for k in range(len(ids)):
        first = k - pending  # the first token of the piece that ends with token k
        context = max(0, first - CONTEXT_TOKENS)
        before = decode(tokenizer, ids[context:first])
        after = decode(tokenizer, ids[context : k + 1])
        if not after.startswith(before):
            return None
        piece = after[len(before) :]
        if not text.startswith(piece, done):
            if not piece.endswith("\ufffd"):
                return None
            spans.append((done, done))  # inside a multi-byte character: nothing added yet
            pending += 1
            continue
        # the pending tokens add nothing; this one adds the whole completed piece
        spans.append((done, done + len(piece)))
        done += len(piece)
        pending = 0
    return spans if done == len(text) else None


def _prefix_spans(tokenizer, ids: Sequence[int]) -> list[Span]:
    spans, done = [], 0
    for k in range(len(ids)):
        prefix = decode(tokenizer, ids[: k + 1])
        end = done if prefix.endswith("\ufffd") else len(prefix)
        spans.append((done, max(done, end)))
        done = max(done, end)
    return spans


def align_groups(student: Sequence[Span], teacher: Sequence[Span]) -> list[tuple[range, range]]:
    """Groups of (student token indices, teacher token indices) covering the same characters,
    cut wherever both tokenizations have a boundary at the same character, in order.

    Both span lists tile the same text from its start (empty spans allowed: they join the
    group that follows them). Tokens after the last common boundary (one side longer than the
    other) form a last group with what is left.
    """
    groups = []
    s = t = s_start = t_start = 0
    while s < len(student) and t < len(teacher):
        s_end, t_end = student[s][1], teacher[t][1]
        if s_end < t_end:
            s += 1
        elif s_end > t_end:
            t += 1
        else:
            s, t = s + 1, t + 1
            groups.append((range(s_start, s), range(t_start, t)))
            s_start, t_start = s, t
    if s_start < len(student) or t_start < len(teacher):
        groups.append((range(s_start, len(student)), range(t_start, len(teacher))))
    return groups


def teacher_starts(student: Sequence[Span], teacher: Sequence[Span]) -> list[int]:
    """For each student token, the index of the teacher token that starts at the same character
    (its first one, skipping empty spans), or -1 where the student token starts inside one."""
    first_at: dict[int, int] = {}
    for index, (start, end) in enumerate(teacher):
        if end > start:
            first_at.setdefault(start, index)
    return [first_at.get(start, -1) if end > start else -1 for start, end in student]


def spread_over_groups(
    groups: Sequence[tuple[range, range]], teacher_logprobs: Sequence[float], num_student: int
) -> list[float]:
    """Each student token's share of its group's teacher log-probability (the sum over the
    group's teacher tokens, split evenly over its student tokens)."""
    out = [0.0] * num_student
    for students, teachers in groups:
        if not students:
            continue
        share = sum(teacher_logprobs[t] for t in teachers) / len(students)
        for s in students:
            out[s] = share
    return out
