"""Two tokenizations of one text: token spans from ids, aligned groups, the teacher token at each
student token's start, and the teacher's top-k moved onto the student's vocabulary.

Three real tokenizers: the tiny task's (byte-level BPE with merges), a byte-level one without
merges (one id per byte, so a multi-byte character spans several ids), and a SentencePiece-style
BPE (Metaspace: a word's leading space is part of its first token, "▁word").
"""

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from nemo_opd.teachers import xtok_vocab
from nemo_opd.teachers.xtok_align import (
    align_groups,
    spread_over_groups,
    teacher_starts,
    token_spans,
)
from nemo_opd.teachers.xtok_vocab import EMPTY_INDEX, VocabMap
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


def _offset_spans(tokenizer, text):
    """The tokenizer's own tokenization of `text`, as (ids, character spans)."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return encoded["input_ids"], [tuple(span) for span in encoded["offset_mapping"]]


@pytest.mark.parametrize("name", ["tiny", "bytes", "metaspace"])
@pytest.mark.parametrize("text", TEXTS)
def test_spans_tile_the_decoded_text(tokenizers, name, text):
    tokenizer = tokenizers[name]
    ids = tokenizer.encode(text, add_special_tokens=False)
    decoded, spans = token_spans(tokenizer, ids)
    assert "".join(decoded[a:b] for a, b in spans) == decoded
    assert all(a <= b for a, b in spans) and spans[0][0] == 0 and spans[-1][1] == len(decoded)
    assert all(spans[i][1] == spans[i + 1][0] for i in range(len(spans) - 1))
    for k in range(len(ids)):  # each span is what the token adds to the decoded prefix
        prefix = tokenizer.decode(ids[: k + 1], clean_up_tokenization_spaces=False)
        if not prefix.endswith("\ufffd"):
            assert decoded[: spans[k][1]] == prefix


def test_spans_of_ids_the_tokenizer_would_not_choose(tokenizers):
    tiny = tokenizers["tiny"]
    text = "What is 12 + 7?"
    # character by character where each character is one token of the vocabulary
    ids = [i for char in text for i in tiny.encode(char, add_special_tokens=False)]
    assert ids != tiny.encode(text, add_special_tokens=False)
    decoded, spans = token_spans(tiny, ids)
    assert decoded == text
    assert [decoded[a:b] for a, b in spans] == [tiny.decode([i]) for i in ids]


def test_a_multi_byte_character_goes_to_the_token_that_completes_it(tokenizers):
    ids = tokenizers["bytes"].encode("a🙂b", add_special_tokens=False)
    assert len(ids) == 6  # a, four bytes, b
    _, spans = token_spans(tokenizers["bytes"], ids)
    assert spans == [(0, 1), (1, 1), (1, 1), (1, 1), (1, 2), (2, 3)]


@pytest.mark.parametrize("pair", [("tiny", "bytes"), ("metaspace", "tiny"), ("bytes", "metaspace")])
@pytest.mark.parametrize("text", TEXTS)
def test_groups_cover_the_same_characters(tokenizers, pair, text):
    student, teacher = (tokenizers[name] for name in pair)
    s_ids = student.encode(text, add_special_tokens=False)
    decoded, s_spans = token_spans(student, s_ids)
    t_ids, t_spans = _offset_spans(teacher, decoded)
    _, t_spans = token_spans(teacher, t_ids)  # the same characters, read from the ids
    groups = align_groups(s_spans, t_spans)
    assert [i for g in groups for i in g[0]] == list(range(len(s_ids)))
    assert [i for g in groups for i in g[1]] == list(range(len(t_ids)))
    for students, teachers in groups:
        s_text = "".join(decoded[a:b] for a, b in (s_spans[i] for i in students))
        t_text = "".join(decoded[a:b] for a, b in (t_spans[i] for i in teachers))
        assert s_text == t_text
    starts = teacher_starts(s_spans, t_spans)
    for index, start in enumerate(starts):
        if start >= 0:
            assert t_spans[start][0] == s_spans[index][0] and t_spans[start][1] > t_spans[start][0]
        elif s_spans[index][1] > s_spans[index][0]:
            # no teacher token starts there: the student token starts inside one
            assert any(a < s_spans[index][0] < b for a, b in t_spans)


def test_one_tokenizer_aligns_one_to_one(tokenizers):
    tiny = tokenizers["tiny"]
    ids = tiny.encode(TEXTS[0], add_special_tokens=False)
    _, spans = token_spans(tiny, ids)
    groups = align_groups(spans, spans)
    assert groups == [(range(i, i + 1), range(i, i + 1)) for i in range(len(ids))]
    assert teacher_starts(spans, spans) == list(range(len(ids)))
    logprobs = [-0.5 * (i + 1) for i in range(len(ids))]
    assert spread_over_groups(groups, logprobs, len(ids)) == logprobs


def test_a_groups_teacher_logprob_is_shared_evenly():
    # student "ab" "c" | teacher "a" "bc": one group of 2 student and 2 teacher tokens
    groups = align_groups([(0, 2), (2, 3)], [(0, 1), (1, 3)])
    assert groups == [(range(0, 2), range(0, 2))]
    assert spread_over_groups(groups, [-1.0, -3.0], 2) == [-2.0, -2.0]
    assert teacher_starts([(0, 2), (2, 3)], [(0, 1), (1, 3)]) == [0, -1]


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
