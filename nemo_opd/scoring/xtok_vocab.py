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

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from nemo_opd.losses.checks import EMPTY_INDEX

ROWS_PER_CHUNK = 16384
"""Positions mapped at a time (bounds the temporaries: a few [rows, k] tensors)."""


class VocabMap:
    """teacher id -> student id, by exact token text.

    Args:
        teacher_to_student: [V_teacher] int64, the student id of each teacher id or -1.
    """

    def __init__(self, teacher_to_student: torch.Tensor) -> None:
        self.teacher_to_student = teacher_to_student
        self._keys: np.ndarray | None = None  # [V_teacher + 1] sort keys (_student_keys)

    @classmethod
    def from_tokenizers(
        cls,
        student: PreTrainedTokenizerBase,
        teacher: PreTrainedTokenizerBase,
        specials: dict[int, int] | None = None,
        teacher_vocab_size: int | None = None,
    ) -> VocabMap:
        """The map of every teacher id to the student token its text starts with (module
        docstring); `specials` ({teacher id: student id}) pairs special tokens (the ends of
        turn). teacher_vocab_size: the teacher model's (padded) vocabulary, when larger than
        its tokenizer's (ids past the tokenizer's map nowhere)."""
        student_bytes, teacher_bytes = token_bytes(student), token_bytes(teacher)
        by_bytes: dict[bytes, int] = {}
        for student_id, key in student_bytes.items():
            by_bytes.setdefault(key, student_id)
        size = max(len(teacher), teacher_vocab_size or 0)
        mapping = torch.full((size,), -1, dtype=torch.int64)
        texts: dict[int, str] = {}
        for teacher_id, key in teacher_bytes.items():
            try:
                texts[teacher_id] = key.decode("utf-8")
            except UnicodeDecodeError:  # part of a character: only the same bytes can say
                mapping[teacher_id] = by_bytes.get(key, -1)
        for teacher_id, first in zip(texts, implied_tokens(student, texts.values()), strict=True):
            mapping[teacher_id] = first
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
            logprobs: [..., k] the teacher's log-probs (over its full vocabulary), on the CPU.
            indices: [..., k] teacher ids, on the CPU.

        Returns:
            ([..., k] log-probs, [..., k] int32 student ids): each slot's teacher id moved to
            its student id; teacher ids that map to the same student id merged (their
            probabilities summed); ids that map nowhere dropped (their mass left to the tail);
            sorted descending, the freed slots at the end as (-inf, EMPTY_INDEX). Computed
            over ROWS_PER_CHUNK positions at a time.
        """
        k = indices.shape[-1]
        values, ids = logprobs.reshape(-1, k).float(), indices.reshape(-1, k)
        out_values = torch.empty_like(values)
        out_ids = torch.empty(ids.shape, dtype=torch.int32)
        for lo in range(0, values.shape[0], ROWS_PER_CHUNK):
            hi = lo + ROWS_PER_CHUNK
            out_values[lo:hi], out_ids[lo:hi] = self._map_rows(values[lo:hi], ids[lo:hi])
        return out_values.reshape(logprobs.shape), out_ids.reshape(indices.shape)

    def _map_rows(
        self, values: torch.Tensor, indices: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """map_topk of [n, k] rows (CPU tensors): the slots sorted by student id, each run of one
        id summed into its first slot in slot order, then sorted by probability (ties by student
        id). Both sorts are numpy sorts of int64 keys that carry the slot in their low bits
        (unique keys: the order is the stable one, and numpy's SIMD sort applies)."""
        n, k = values.shape
        shift = max(1, (k - 1).bit_length())
        slot = np.arange(k, dtype=np.int64)
        logprobs = np.ascontiguousarray(values.numpy())
        by_student = self._student_keys(indices.numpy(), logprobs) << shift | slot
        by_student.sort(axis=-1)
        order, student = by_student & (1 << shift) - 1, by_student >> shift
        probs = torch.from_numpy(np.take_along_axis(logprobs, order, axis=-1)).exp()
        first = np.ones((n, k), dtype=bool)  # the first slot of each run of one student id
        np.not_equal(student[:, 1:], student[:, :-1], out=first[:, 1:])
        run_start = np.maximum.accumulate(np.where(first, slot, 0), axis=-1)
        totals = torch.zeros_like(probs).scatter_add_(-1, torch.from_numpy(run_start), probs)
        empty = ~first | (student == _UNMAPPED)
        merged = _log_or_empty(totals, torch.from_numpy(empty))
        by_mass = _descending_keys(merged)
        by_mass[empty] = 1 << 32  # after every real slot, -inf ones included
        by_mass = by_mass << shift | slot
        by_mass.sort(axis=-1)
        by_mass &= (1 << shift) - 1
        ids = np.where(empty, EMPTY_INDEX, student).astype(np.int32)
        return (
            torch.from_numpy(np.take_along_axis(merged, by_mass, axis=-1)),
            torch.from_numpy(np.take_along_axis(ids, by_mass, axis=-1)),
        )

    def _student_keys(self, indices: np.ndarray, logprobs: np.ndarray) -> np.ndarray:
        """[n, k] int64: each slot's student id, _UNMAPPED for a teacher id that maps nowhere,
        lies outside the map (a padded vocabulary's) or has log-prob -inf."""
        if self._keys is None:
            mapping = self.teacher_to_student.numpy()
            self._keys = np.append(np.where(mapping >= 0, mapping, _UNMAPPED), _UNMAPPED)
        outside = len(self._keys) - 1  # negative ids read as huge unsigned ones: outside too
        rows = np.minimum(indices.astype(np.int64).view(np.uint64), outside)
        keys = self._keys[rows]
        keys[logprobs == -np.inf] = _UNMAPPED
        return keys


_UNMAPPED = 1 << 40
"""The sort key of a slot with no student id: after every id."""


def _log_or_empty(probs: torch.Tensor, empty: torch.Tensor) -> np.ndarray:
    """[n, k] log of probs, -inf at empty slots (log(0) takes a slow path on CPUs: empty slots
    are set to 1 first)."""
    return probs.masked_fill_(empty, 1.0).log_().masked_fill_(empty, float("-inf")).numpy()


def _descending_keys(values: np.ndarray) -> np.ndarray:
    """[...] int64 in [0, 2**32): keys whose ascending order is the float32 values'
    descending order (the IEEE bits made order-preserving, then reversed)."""
    bits = values.view(np.int32)
    ascending = (bits ^ ((bits >> 31) | np.int32(-(2**31)))).view(np.uint32)
    return (np.uint32(0xFFFFFFFF) - ascending).astype(np.int64)


CONTINUATIONS = ("", "0", " ", "a")
"""What a teacher token's text is tried with, to find a student token of the same bytes that
the student writes there (a token such as " = " exists only before a digit)."""


def implied_tokens(student: PreTrainedTokenizerBase, texts) -> list[int]:
    """For each text, the student token that a continuation starting with it begins with: the
    student token of exactly its bytes where the student writes the text (alone or before
    one of CONTINUATIONS) with that token, else the first token of the student's own encoding
    of the text (Qwen's "1" for Llama 3's "121": Qwen writes digits one by one), else -1."""
    texts = list(texts)
    known = token_bytes(student)
    spelled = set(known.values())
    out = first_tokens(student, texts, known)
    # done: the student wrote the text as one token, or has no token of exactly its bytes
    whole = [
        (f >= 0 and known[f] == t.encode()) or t.encode() not in spelled
        for f, t in zip(out, texts, strict=True)
    ]
    for continuation in CONTINUATIONS[1:]:
        open_ = [index for index, done in enumerate(whole) if not done]
        tried = [texts[index] + continuation for index in open_]
        for index, first in zip(open_, first_tokens(student, tried, known), strict=True):
            if first >= 0 and known[first] == texts[index].encode():
                out[index], whole[index] = first, True
    return out


def encode_as_text(tokenizer: PreTrainedTokenizerBase, texts: list[str]) -> list:
    """The fast tokenizer's Rust encodings (ids and character offsets) of `texts`, no special
    tokens added and control strings read as text: one batched call into its core, with the
    backend's special-token flag set for the call and put back after it."""
    backend = tokenizer.backend_tokenizer
    was = backend.encode_special_tokens
    backend.encode_special_tokens = True
    try:
        return backend.encode_batch(texts, add_special_tokens=False)
    finally:
        backend.encode_special_tokens = was


def first_tokens(
    tokenizer: PreTrainedTokenizerBase, texts: list[str], known: dict[int, bytes]
) -> list[int]:
    """For each text, the first token of the tokenizer's own encoding of it, or -1 where that
    token is not a prefix of the text's bytes. A SentencePiece tokenizer reads each text after
    a newline, as running text (else its word-initial "▁" would stand for a space the text does
    not have). Control strings in the texts are text. One batched call into the tokenizer's
    Rust core."""
    context = "\n" if _vocabulary_style(tokenizer) == "sentencepiece" else ""
    encodings = encode_as_text(tokenizer, [context + text for text in texts])
    out = []
    for text, encoding in zip(texts, encodings, strict=True):
        first = -1
        for token, (start, _) in zip(encoding.ids, encoding.offsets, strict=True):
            if start >= len(context):  # the first token of the text itself
                prefix = known.get(token)
                if start == len(context) and prefix and text.encode().startswith(prefix):
                    first = token
                break
        out.append(first)
    return out


def token_bytes(tokenizer: PreTrainedTokenizerBase) -> dict[int, bytes]:
    """{id: its bytes} for every id but the special tokens, read from the vocabulary: GPT-2's
    byte alphabet for a byte-level BPE, "▁" as a space and `<0xHH>` as one byte for a
    SentencePiece vocabulary; for any other tokenizer, the UTF-8 of the text a token adds when
    decoded after a plain context token (a token that is part of a character is then left
    out). One pass over the vocabulary: a second or two at 150k tokens."""
    special = special_ids(tokenizer)
    style = _vocabulary_style(tokenizer)
    vocab = {
        index: piece
        for piece, index in tokenizer.get_vocab().items()
        if index not in special or (style == "sentencepiece" and _is_byte_piece(piece))
    }
    if style == "byte_level":
        alphabet = _byte_alphabet()
        return {
            index: bytes(alphabet[c] for c in piece)
            if all(c in alphabet for c in piece)
            else piece.encode()  # an added token written as text
            for index, piece in vocab.items()
        }
    if style == "sentencepiece":
        return {index: _piece_bytes(piece) for index, piece in vocab.items()}
    return _decoded_bytes(tokenizer, sorted(vocab))


class ByteTable:
    """Every id's bytes in one flat buffer, so that a sequence's byte lengths and its bytes are
    numpy gathers rather than a Python step per token.

    Args:
        by_id: {id: bytes}; ids not in it have no bytes.
    """

    def __init__(self, by_id: dict[int, bytes]) -> None:
        size = max(by_id, default=-1) + 1
        self.lengths = np.zeros(size + 1, dtype=np.int64)  # the last: ids out of range
        for index, key in by_id.items():
            self.lengths[index] = len(key)
        self.starts = np.zeros(size + 1, dtype=np.int64)
        np.cumsum(self.lengths[:-1], out=self.starts[1:])
        self.buffer = np.frombuffer(
            b"".join(by_id.get(i, b"") for i in range(size)) or b"\0", dtype=np.uint8
        )

    def ids(self, ids) -> np.ndarray:
        """[n] int64 row numbers of `ids` (out-of-range ids: the empty last row)."""
        ids = np.asarray(ids, dtype=np.int64)
        return np.where((ids >= 0) & (ids < len(self.lengths) - 1), ids, len(self.lengths) - 1)

    def byte_lengths(self, ids) -> np.ndarray:
        """[n] int64: the bytes of each id."""
        return self.lengths[self.ids(ids)]

    def join(self, ids) -> bytes:
        """The bytes of `ids`, one after the other."""
        rows = self.ids(ids)
        lengths = self.lengths[rows]
        total = int(lengths.sum())
        if total == 0:
            return b""
        ends = np.cumsum(lengths)
        offsets = np.repeat(self.starts[rows] - (ends - lengths), lengths)
        return self.buffer[offsets + np.arange(total)].tobytes()


def special_ids(tokenizer: PreTrainedTokenizerBase) -> set[int]:
    """The ids of the tokenizer's special tokens: those it names (eos, pad, ...) and every
    added token marked special (control tokens such as <|im_start|> or [INST])."""
    added = getattr(tokenizer, "added_tokens_decoder", {})
    return set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}


def _vocabulary_style(tokenizer: PreTrainedTokenizerBase) -> str:
    decoder = repr(getattr(getattr(tokenizer, "backend_tokenizer", None), "decoder", None))
    if "ByteLevel" in decoder:
        return "byte_level"
    if "▁" in decoder or "Metaspace" in decoder:
        return "sentencepiece"
    return "other"


def _is_byte_piece(piece: str) -> bool:
    return len(piece) == 6 and piece.startswith("<0x") and piece.endswith(">")


def _piece_bytes(piece: str) -> bytes:
    if _is_byte_piece(piece):
        return bytes([int(piece[3:5], 16)])
    return piece.replace("▁", " ").encode()


def _decoded_bytes(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> dict[int, bytes]:
    context = tokenizer.encode("a", add_special_tokens=False)[:1]
    base = decode(tokenizer, context)
    texts = tokenizer.batch_decode(
        [[*context, i] for i in ids], skip_special_tokens=False, clean_up_tokenization_spaces=False
    )
    keys = {}
    for index, after in zip(ids, texts, strict=True):
        text = after[len(base) :] if after.startswith(base) else ""
        if text and "\ufffd" not in text:
            keys[index] = text.encode("utf-8")
    return keys


def is_byte_complete(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Whether the tokenizer can write any text without its unknown token: a byte-level BPE,
    or a model with byte fallback."""
    if _vocabulary_style(tokenizer) == "byte_level":
        return True
    model = getattr(getattr(tokenizer, "backend_tokenizer", None), "model", None)
    return bool(getattr(model, "byte_fallback", False))


def decode(tokenizer: PreTrainedTokenizerBase, ids: list[int]) -> str:
    """The text of `ids`, special tokens included and nothing cleaned up."""
    return tokenizer.decode(
        list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False
    )


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
