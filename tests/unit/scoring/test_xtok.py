"""Two tokenizations of one text placed by byte offsets: the teacher token at each student
token's start, aligned groups, and the teacher's top-k moved onto the student's vocabulary.

Three real tokenizers: the tiny task's (byte-level BPE with merges), a byte-level one without
merges (one id per byte, so a multi-byte character spans several ids), and a SentencePiece-style
BPE (Metaspace: a word's leading space is part of its first token, "▁word").
"""

import math

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nemo_opd.scoring import xtok_vocab
from nemo_opd.scoring.xtok_align import (
    INSIDE,
    char_starts,
    group_ids,
    running_starts,
    sources,
    spread_over_groups,
)
from nemo_opd.scoring.xtok_vocab import EMPTY_INDEX, VocabMap
from nemo_opd.tiny import resolve_pretrained

TEXTS = [
    "What is 12 + 7? 12 + 7 = 19. \\boxed{19}",
    "Leo has 36 pens and gives away 5.  How many are left?\n36 - 5 = 31.",
    "Café au lait: 3 € — ünïcödé and emoji 🙂 end",
]
CORPUS = TEXTS * 20 + ["the quick brown fox jumps over the lazy dog"] * 20


def _byte_level() -> PreTrainedTokenizerFast:
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {char: i for i, char in enumerate(sorted(alphabet))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=None)


def _metaspace() -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    bytes_ = [f"<0x{i:02X}>" for i in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", *bytes_])
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


@pytest.fixture(scope="module")
def tokenizers():
    tiny = AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer"))
    return {"tiny": tiny, "bytes": _byte_level(), "metaspace": _metaspace()}


def _starts(pieces: list[bytes]) -> np.ndarray:
    return running_starts([len(p) for p in pieces])


def test_a_student_token_is_graded_where_a_teacher_token_starts_at_its_byte():
    # student "ab" "c" | teacher "a" "bc": one group; only the first student token is graded
    student, teacher = _starts([b"ab", b"c"]), _starts([b"a", b"bc"])
    assert sources(student, teacher).tolist() == [0, -1]
    s_group, t_group = group_ids(student, teacher)
    assert s_group.tolist() == [0, 0] and t_group.tolist() == [0, 0]
    assert spread_over_groups(s_group, t_group, np.array([-1.0, -3.0])).tolist() == [-2.0, -2.0]


def test_one_tokenization_aligns_one_to_one():
    pieces = [b"What", b" is", b" 12", b" +", b" 7", b"?"]
    starts = _starts(pieces)
    assert sources(starts, starts).tolist() == list(range(len(pieces)))
    s_group, t_group = group_ids(starts, starts)
    logprobs = np.array([-0.5 * (i + 1) for i in range(len(pieces))])
    assert spread_over_groups(s_group, t_group, logprobs).tolist() == logprobs.tolist()


def test_the_same_split_of_a_character_is_graded_inside_it():
    # "a ≈": student " \xe2" "\x89\x88", teacher the same bytes: both graded at their bytes
    emoji = "≈".encode()
    student = _starts([b"a", b" " + emoji[:1], emoji[1:]])
    teacher = _starts([b"a", b" " + emoji[:1], emoji[1:]])
    assert sources(student, teacher).tolist() == [0, 1, 2]
    # a teacher that keeps the character whole: the student's second piece starts inside it
    teacher = _starts([b"a", b" ", emoji])
    assert sources(student, teacher).tolist() == [0, 1, -1]


def test_tokens_of_no_bytes_are_never_graded():
    student = _starts([b"", b"ab"])
    teacher = _starts([b"ab"])
    assert sources(student, teacher).tolist() == [-1, 0]


def test_a_normalizing_teacher_is_placed_by_its_offsets_at_whole_characters():
    # "cafe\u0301!" read as NFC "café!": tokens "caf" (0, 3), "é" (3, 4: the mark at 4 not
    # covered), "!" (5, 6); a split character's second token starts INSIDE
    text = "cafe\u0301!"
    starts = char_starts([(0, 3), (3, 4), (5, 6)], text)
    assert starts.tolist() == [0, 3, 6, 7]
    assert char_starts([(0, 1), (0, 1)], "é").tolist() == [0, INSIDE, 2]
    student = _starts([b"caf", b"e", "\u0301".encode(), b"!"])
    assert sources(student, starts).tolist() == [0, 1, -1, 2]


def test_identical_tokenizers_map_top_k_unchanged(tokenizers):
    tiny = tokenizers["tiny"]
    vocab = VocabMap.from_tokenizers(tiny, tiny)
    special = set(tiny.all_special_ids)
    mapped = vocab.teacher_to_student
    assert all(int(mapped[i]) == i for i in range(len(tiny)) if i not in special)
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 5, len(tiny), generator=gen) * 3
    logits[..., sorted(special)] = -30.0  # keep specials out of the top-k
    values, indices = torch.log_softmax(logits, -1).topk(8, dim=-1)
    out_values, out_indices = vocab.map_topk(values, indices)
    assert torch.equal(out_indices, indices.to(torch.int32))
    torch.testing.assert_close(out_values, values)


def test_top_k_merges_duplicates_and_leaves_the_unmapped_mass_to_the_tail():
    # teacher ids 0..4 -> student ids 7, 7, -1, 3, 9
    vocab = VocabMap(torch.tensor([7, 7, -1, 3, 9]))
    probs = torch.tensor([[0.3, 0.2, 0.25, 0.15, 0.05]])
    values, indices = vocab.map_topk(probs.log(), torch.tensor([[0, 1, 2, 3, 4]]))
    assert indices.tolist() == [[7, 3, 9, EMPTY_INDEX, EMPTY_INDEX]]
    expected = [math.log(0.5), math.log(0.15), math.log(0.05)]
    torch.testing.assert_close(values[0, :3], torch.tensor(expected))
    assert torch.isneginf(values[0, 3:]).all()
    tail = 1.0 - values.exp().sum()
    assert abs(float(tail) - (0.05 + 0.25)) < 1e-6  # the unlisted 0.05 and the unmapped 0.25


def test_texts_map_across_tokenizers(tokenizers):
    vocab = VocabMap.from_tokenizers(tokenizers["tiny"], tokenizers["bytes"])
    bytes_tok, tiny = tokenizers["bytes"], tokenizers["tiny"]
    for char in "7+= {":
        (teacher_id,) = bytes_tok.encode(char, add_special_tokens=False)
        (student_id,) = tiny.encode(char, add_special_tokens=False)
        assert int(vocab.teacher_to_student[teacher_id]) == student_id
    assert 0 < vocab.coverage() <= 1


def test_partial_characters_match_by_their_bytes(tokenizers):
    # a SentencePiece byte-fallback token and a byte-level token of the same byte
    vocab = VocabMap.from_tokenizers(tokenizers["metaspace"], tokenizers["bytes"])
    student, teacher = tokenizers["metaspace"], tokenizers["bytes"]
    emoji = teacher.encode("🙂", add_special_tokens=False)  # four byte tokens: F0 9F 99 82
    for byte, teacher_id in zip("🙂".encode(), emoji, strict=True):
        student_id = student.convert_tokens_to_ids(f"<0x{byte:02X}>")
        assert int(vocab.teacher_to_student[teacher_id]) == student_id


def test_top_k_of_many_positions_is_mapped_in_chunks_alike():
    gen = torch.Generator().manual_seed(7)
    vocab = VocabMap(torch.randint(-1, 40, (60,), generator=gen))  # duplicates and holes
    rows = 2 * xtok_vocab.ROWS_PER_CHUNK + 5
    logprobs = torch.log_softmax(torch.randn(rows, 60, generator=gen), -1)
    values, indices = logprobs.topk(8, dim=-1)
    whole = vocab._map_rows(values, indices)
    chunked = vocab.map_topk(values.view(rows, 1, 8), indices.view(rows, 1, 8))
    assert torch.equal(chunked[1].view(rows, 8), whole[1])
    assert torch.equal(chunked[0].view(rows, 8), whole[0])


def _reference_map_rows(mapping: torch.Tensor, values: torch.Tensor, indices: torch.Tensor):
    """The top-k map as first written (torch sorts), kept as the reference: slots sorted stably
    by student id, each run summed into its group by scatter_add, groups sorted stably by
    mass."""
    unmapped = torch.iinfo(torch.int64).max
    ids = indices.long()
    inside = (ids >= 0) & (ids < mapping.shape[0])
    student = torch.where(inside, mapping[ids.clamp(0, mapping.shape[0] - 1)], -1)
    student = student.masked_fill(values == float("-inf"), -1)
    key, order = torch.where(student >= 0, student, unmapped).sort(dim=-1, stable=True)
    probs = values.gather(-1, order).exp()
    starts = torch.ones_like(key, dtype=torch.bool)
    starts[:, 1:] = key[:, 1:] != key[:, :-1]
    group = starts.long().cumsum(-1) - 1
    totals = torch.zeros_like(probs).scatter_add_(-1, group, probs)
    group_ids = torch.full_like(key, unmapped).scatter_(-1, group, key)
    empty = group_ids == unmapped
    merged = totals.masked_fill(empty, 1.0).log().masked_fill(empty, float("-inf"))
    by_mass = merged.argsort(dim=-1, descending=True, stable=True)
    merged_ids = group_ids.masked_fill(empty, EMPTY_INDEX)
    return merged.gather(-1, by_mass), merged_ids.gather(-1, by_mass).to(torch.int32)


@pytest.mark.parametrize("k", [1, 5, 64, 100])
@pytest.mark.parametrize("case", ["ties", "distinct", "underflow", "sparse"])
def test_top_k_map_is_the_reference_bit_for_bit(k, case):
    """Duplicates, holes, ids outside the map (negative and past its end), -inf slots, tied
    log-probs and groups whose probability underflows to 0: the same values and ids, in the
    same order, as the reference."""
    gen = torch.Generator().manual_seed(k)
    students = 40 if case != "sparse" else 100_000
    vocab = VocabMap(torch.randint(-1, students, (3000,), generator=gen))
    scale = 80.0 if case == "underflow" else 1.0
    values = torch.log_softmax(torch.randn(2000, k, generator=gen) * scale, -1)
    if case == "ties":
        values = (values * 4).round() / 4
    values[torch.rand(values.shape, generator=gen) < 0.05] = float("-inf")
    values = values.sort(-1, descending=True).values
    indices = torch.randint(-3, 3005, values.shape, generator=gen, dtype=torch.int32)
    got = vocab.map_topk(values, indices)
    expected = _reference_map_rows(vocab.teacher_to_student, values, indices)
    assert torch.equal(got[1], expected[1])
    assert torch.equal(got[0], expected[0])
