"""The teacher's vocabulary on the student's: exact text matches, and a tail for the rest.

A teacher with another tokenizer answers with a distribution over its own tokens. Each teacher
token whose text is also exactly one student token's text moves to that student id (`VocabMap`);
a teacher token with no such student token maps nowhere, and its probability stays with the
teacher's tail (the mass outside the listed ids), which the top-k loss treats as a bucket of its
own: nothing is spread over student ids the teacher never named.

Why exact matches and not a learned or sorted matching: on a student position the loss needs
the teacher's probability of the student's next token, and an exact text match is the only
mapping under which that is the teacher's probability of the same text. The universal logit
distillation loss (Boizard et al., 2024) matches sorted probabilities instead, which needs no
shared vocabulary but compares unrelated tokens; TRL's GOLD uses exact matches where the
vocabularies share a token and sorted matching for the rest. Here the rest is left in the tail,
so the divergence is exact on what the vocabularies share and honest about the mass they do not
(the share of the teacher's top-k mass that maps is logged).

Tokens are matched by their bytes: the text a token adds when decoded after a plain context
token (so that SentencePiece's word-initial "▁" reads as a space, as in running text), and for
a token that is part of a multi-byte character, its bytes (byte-level and byte-fallback
tokenizers). Special tokens map nowhere, except pairs given explicitly (the teacher's end of
turn -> the student's).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from nemo_opd.losses.checks import EMPTY_INDEX
from nemo_opd.teachers.xtok_align import decode

ROWS_PER_CHUNK = 1024
"""Positions mapped at a time: a merge builds [rows, k, k] pair tensors (17 MB of floats at
k = 64)."""


class VocabMap:
    """teacher id -> student id, by exact token text.

    Args:
        teacher_to_student: [V_teacher] int64, the student id of each teacher id or -1.
    """

    def __init__(self, teacher_to_student: torch.Tensor) -> None:
        self.teacher_to_student = teacher_to_student

    @classmethod
    def from_tokenizers(
        cls,
        student: PreTrainedTokenizerBase,
        teacher: PreTrainedTokenizerBase,
        specials: dict[int, int] | None = None,
        teacher_vocab_size: int | None = None,
    ) -> VocabMap:
        """The map of every teacher id to the student id with the same text; `specials`
        ({teacher id: student id}) pairs special tokens (say, the ends of turn).
        teacher_vocab_size: the teacher model's (padded) vocabulary, when larger than its
        tokenizer's (ids past the tokenizer's map nowhere)."""
        by_bytes: dict[bytes, int] = {}
        for student_id, key in token_bytes(student).items():
            by_bytes.setdefault(key, student_id)
        size = max(len(teacher), teacher_vocab_size or 0)
        mapping = torch.full((size,), -1, dtype=torch.int64)
        for teacher_id, key in token_bytes(teacher).items():
            mapping[teacher_id] = by_bytes.get(key, -1)
        for teacher_id, student_id in (specials or {}).items():
            mapping[teacher_id] = student_id
        return cls(mapping)

    def coverage(self) -> float:
        """Share of the teacher's vocabulary that maps to a student id."""
        return float((self.teacher_to_student >= 0).float().mean())

    def map_topk(
        self, logprobs: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A teacher's top-k in the student's vocabulary.

        Args:
            logprobs: [..., k] the teacher's log-probs (over its full vocabulary).
            indices: [..., k] teacher ids.

        Returns:
            ([..., k] log-probs, [..., k] int32 student ids): each slot's teacher id moved to
            its student id; teacher ids that map to the same student id merged (their
            probabilities summed); ids that map nowhere dropped (their mass left to the tail);
            sorted descending, the freed slots at the end as (-inf, EMPTY_INDEX). Computed
            over ROWS_PER_CHUNK positions at a time (a merge compares every pair of slots).
        """
        k = indices.shape[-1]
        values, ids = logprobs.reshape(-1, k).float(), indices.reshape(-1, k)
        out_values = torch.empty_like(values)
        out_ids = torch.empty(ids.shape, dtype=torch.int32, device=ids.device)
        for lo in range(0, values.shape[0], ROWS_PER_CHUNK):
            hi = lo + ROWS_PER_CHUNK
            out_values[lo:hi], out_ids[lo:hi] = self._map_rows(values[lo:hi], ids[lo:hi])
        return out_values.reshape(logprobs.shape), out_ids.reshape(indices.shape)

    def _map_rows(
        self, values: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """map_topk of [n, k] rows."""
        mapping = self.teacher_to_student.to(indices.device)
        ids = indices.long()
        inside = (ids >= 0) & (ids < mapping.shape[0])  # a padded vocabulary's ids map nowhere
        student = torch.where(inside, mapping[ids.clamp(0, mapping.shape[0] - 1)], -1)
        values = values.masked_fill(student < 0, float("-inf"))
        # Merge duplicates: for each slot, the log-sum-exp over the slots of the same student
        # id, kept at the first of them only.
        same = (student.unsqueeze(-1) == student.unsqueeze(-2)) & (student >= 0).unsqueeze(-1)
        merged = torch.where(same, values.unsqueeze(-2), float("-inf")).logsumexp(dim=-1)
        k = student.shape[-1]
        earlier = torch.ones(k, k, dtype=torch.bool, device=student.device).tril(-1)
        first = ~(same & earlier).any(dim=-1)
        keep = first & (student >= 0) & (merged > float("-inf"))
        merged = merged.masked_fill(~keep, float("-inf"))
        ids = student.masked_fill(~keep, EMPTY_INDEX)
        order = merged.argsort(dim=-1, descending=True, stable=True)
        return merged.gather(-1, order), ids.gather(-1, order).to(torch.int32)


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes]:
    """{id: its bytes} for every id but the special tokens: the UTF-8 of the text it adds after
    a plain context token where that is whole characters; a byte-level token's bytes (GPT-2's
    byte alphabet) or a byte-fallback token's byte (`<0xHH>`) where it is part of one."""
    context = tokenizer.encode("a", add_special_tokens=False)[:1]
    base = decode(tokenizer, context)
    special = set(tokenizer.all_special_ids)
    byte_level = "ByteLevel" in repr(getattr(tokenizer.backend_tokenizer, "decoder", None))
    alphabet = _byte_alphabet() if byte_level else {}
    keys = {}
    for token_id in range(len(tokenizer)):
        if token_id in special:
            continue
        after = decode(tokenizer, [*context, token_id])
        text = after[len(base) :] if after.startswith(base) else ""
        if text and "\ufffd" not in text:
            keys[token_id] = text.encode("utf-8")
            continue
        piece = tokenizer.convert_ids_to_tokens(token_id)
        if byte_level and piece and all(char in alphabet for char in piece):
            keys[token_id] = bytes(alphabet[char] for char in piece)
        elif piece and len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">"):
            keys[token_id] = bytes([int(piece[3:5], 16)])
    return keys


def _byte_alphabet() -> dict[str, int]:
    """GPT-2's byte-level alphabet, character -> byte: printable bytes stand for themselves,
    the others for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    shown = set(printable)
    chars, extra = {}, 0
    for byte in range(256):
        if byte in shown:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars
