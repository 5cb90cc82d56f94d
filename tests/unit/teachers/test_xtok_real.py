"""The teacher with another tokenizer on real vocabularies and chat templates: Qwen3 <- Llama 3,
Qwen3 <- Tekken, Llama 3 <- Qwen3, and a SentencePiece student (Mistral v1) <- Qwen3.

Alignment is checked by an independent reader: every token's raw bytes from its vocabulary
(GPT-2's byte alphabet, SentencePiece's "▁" and <0xHH> pieces), byte offsets from their running
sums, never the decoding of the code under test. Over hostile text (tests/real_tokenizers.py):
the teacher reads exactly the bytes the student wrote (or their NFC form, for Qwen's
normalizing tokenizer), every student token that starts where a teacher token starts is graded
from the teacher's position before that token, and no other is.
"""

import copy
import unicodedata

import pytest
import torch
from real_tokenizers import HOSTILE_TEXTS

from nemo_opd.algorithms.tokenizers import tokenizer_difference
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.errors import SetupError
from nemo_opd.scoring.base import Rollouts
from nemo_opd.scoring.rendering import TeacherRendering

PAIRS = [("qwen3", "llama3"), ("qwen3", "tekken"), ("llama3", "qwen3"), ("mistral_sp", "qwen3")]
"""(student, teacher)."""
PROMPT = "What is 7 * 6?"
CUT = "The answer is 4🎉"  # its last token(s) cut mid-character below


def _raw_bytes(tokenizer) -> dict[int, bytes]:
    """{id: bytes} read straight from the vocabulary, special tokens left out."""
    alphabet = {}
    printable = [*range(33, 127), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    extra = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + extra)] = byte
            extra += 1
    added = tokenizer.added_tokens_decoder
    special = set(tokenizer.all_special_ids) | {i for i, t in added.items() if t.special}
    vocab = tokenizer.get_vocab()
    sentencepiece = "▁the" in vocab
    out = {}
    for piece, index in vocab.items():
        if index in special:
            continue
        if sentencepiece and piece.startswith("<0x") and len(piece) == 6:
            out[index] = bytes([int(piece[3:5], 16)])
        elif sentencepiece or not all(char in alphabet for char in piece):
            out[index] = piece.replace("▁", " ").encode()
        else:
            out[index] = bytes(alphabet[char] for char in piece)
    return out


@pytest.fixture(scope="module")
def rendering(real_tokenizer):
    """(student, teacher) -> TeacherRendering(student, ChatFormatter(teacher)), built once for
    the module (what it caches, the vocabulary map and the templates' closings, are the same
    for every test; a test that needs other settings builds its own)."""
    built = {}

    def get(student_name, teacher_name):
        if (student_name, teacher_name) not in built:
            student, teacher = real_tokenizer(student_name), real_tokenizer(teacher_name)
            built[student_name, teacher_name] = TeacherRendering(student, ChatFormatter(teacher))
        return built[student_name, teacher_name]

    return get


@pytest.fixture(scope="module")
def qwen3_base(real_tokenizer):
    """Qwen3's tokenizer as a base model's: eos <|endoftext|>, the instruct template kept."""
    qwen = real_tokenizer("qwen3")
    base = qwen.__class__.from_pretrained(qwen.name_or_path, eos_token="<|endoftext|>")
    base.chat_template = qwen.chat_template
    return base


@pytest.fixture(scope="module")
def raw(real_tokenizer):
    cache = {}

    def get(name):
        if name not in cache:
            cache[name] = _raw_bytes(real_tokenizer(name))
        return cache[name]

    return get


def _logs(tokenizer, responses, system=None, cut=0):
    formatter = ChatFormatter(tokenizer, system_prompt=system)
    logs = []
    for response in responses:
        ids = tokenizer(response, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        ids = ids[:-cut] if cut else [*ids, tokenizer.eos_token_id]
        turn = {"role": "assistant", "content": response, "token_ids": ids}
        logs.append([*formatter.prompt_log(PROMPT), turn])
    return logs


def _check_alignment(student, teacher, raw_s, raw_t, logs, rows, normalized=False):
    """The independent reader's checks of each row's only assistant turn."""
    width = max(sum(len(m["token_ids"]) for m in log) for log in logs)
    source = rows.source_positions(width)
    for row, log in enumerate(logs):
        start = sum(len(m["token_ids"]) for m in log[:-1])
        ids = log[-1]["token_ids"]
        ended = ids[-1] == student.eos_token_id
        content = ids[:-1] if ended else ids
        s_bytes = [raw_s[i] for i in content]
        s_text = b"".join(s_bytes)
        if s_text.startswith(b" ") and student.decode(content[:1]) == s_bytes[0][1:].decode(
            errors="replace"
        ):
            s_bytes[0] = s_bytes[0][1:]  # SentencePiece's leading space is not the text's
            s_text = s_text[1:]
        s_starts = [sum(len(b) for b in s_bytes[:j]) for j in range(len(s_bytes))]
        t_ids = rows.batch["input_ids"][row].tolist()
        t_len = int(rows.batch["input_lengths"][row])
        t_start = sum(len(m["token_ids"]) for m in rows.logs[row][:-1])
        t_turn = t_ids[t_start:t_len]
        n_content = next(
            (i for i, t in enumerate(t_turn) if t not in raw_t), len(t_turn)
        )  # the teacher's content runs up to its first special token (its end of turn)
        t_bytes = [raw_t[i] for i in t_turn[:n_content]]
        t_text = b"".join(t_bytes)
        valid = s_text.decode("utf-8", errors="ignore").encode()
        expected = unicodedata.normalize("NFC", valid.decode()).encode() if normalized else valid
        assert t_text == expected, (t_text[:60], expected[:60])
        t_starts = {sum(len(b) for b in t_bytes[:i]): i for i in range(len(t_bytes))}
        t_ends = {sum(len(b) for b in t_bytes[: i + 1]) for i in range(len(t_bytes))}
        by_chars = normalized and unicodedata.normalize("NFC", valid.decode()) != valid.decode()
        for j, offset in enumerate(s_starts):
            want = -1
            if not s_bytes[j]:
                pass  # no bytes (SentencePiece's lone "▁" at the start): nothing to grade
            elif offset < len(valid) and not by_chars:
                want = t_starts.get(offset, -1)
            elif offset < len(valid):  # the teacher read the NFC form: whole characters only
                try:
                    head = unicodedata.normalize("NFC", s_text[:offset].decode()).encode()
                except UnicodeDecodeError:
                    head = None
                if head is not None and t_text.startswith(head):
                    want = t_starts.get(len(head), -1)
            if want >= 0:  # a token over several teacher tokens must end where one ends
                end = s_starts[j + 1] if j + 1 < len(s_starts) else len(s_text)
                if by_chars:  # into the teacher's (NFC) bytes
                    end = len(unicodedata.normalize("NFC", s_text[:end].decode()).encode())
                first_end = t_text_end(t_bytes, want)
                if end > first_end and end not in t_ends:
                    want = -1
            want = t_start + want - 1 if want >= 0 else -1
            assert source[row, start + j - 1] == want, (row, j, offset, s_text[offset - 8 : offset])
        if ended:
            eos_pos = start + len(content) - 1
            assert source[row, eos_pos] == t_start + n_content - 1
            assert teacher.added_tokens_decoder[t_turn[n_content]].special


def t_text_end(t_bytes, index):
    return sum(len(b) for b in t_bytes[: index + 1])


@pytest.mark.parametrize(("student_name", "teacher_name"), PAIRS)
def test_alignment_on_hostile_text(student_name, teacher_name, real_tokenizer, raw, rendering):
    student, teacher = real_tokenizer(student_name), real_tokenizer(teacher_name)
    logs = _logs(student, HOSTILE_TEXTS)
    rows = rendering(student_name, teacher_name).teacher_rows(logs)
    normalized = teacher_name == "qwen3"
    _check_alignment(student, teacher, raw(student_name), raw(teacher_name), logs, rows, normalized)


@pytest.mark.parametrize(("student_name", "teacher_name"), PAIRS)
def test_a_response_cut_mid_character(student_name, teacher_name, real_tokenizer, raw, rendering):
    """A response that stops inside a character: the teacher reads the whole characters, the
    rest is not graded."""
    student, teacher = real_tokenizer(student_name), real_tokenizer(teacher_name)
    logs = _logs(student, [CUT], cut=1)
    rows = rendering(student_name, teacher_name).teacher_rows(logs)
    _check_alignment(
        student, teacher, raw(student_name), raw(teacher_name), logs, rows, teacher_name == "qwen3"
    )


def test_control_strings_in_the_students_text_are_text_to_the_teacher(real_tokenizer, rendering):
    student, teacher = real_tokenizer("qwen3"), real_tokenizer("tekken")
    logs = _logs(student, ["[INST] <unk> </s> [/INST] done"])
    rows = rendering("qwen3", "tekken").teacher_rows(logs)
    t_start = sum(len(m["token_ids"]) for m in rows.logs[0][:-1])
    turn = rows.batch["input_ids"][0, t_start : int(rows.batch["input_lengths"][0])].tolist()
    assert not any(teacher.added_tokens_decoder.get(t) for t in turn[:-1])
    assert turn[-1] == teacher.eos_token_id


def test_a_tekken_teacher_can_spell_every_qwen_token(rendering):
    """Qwen's plain token "<unk>" is text to Tekken's byte-level BPE, not its control token."""
    assert rendering("qwen3", "tekken").unspellable() == []


def test_the_turn_end_the_template_writes_is_graded(real_tokenizer, qwen3_base):
    """A Qwen base teacher (eos <|endoftext|>, template closing with <|im_end|>): the student's
    end of turn reads the teacher's <|im_end|> position, and the map sends it to the student's."""
    student, base = real_tokenizer("llama3"), qwen3_base
    rendering = TeacherRendering(student, ChatFormatter(base))
    logs = _logs(student, ["Four."])
    rows = rendering.teacher_rows(logs)
    source = rows.source_positions(sum(len(m["token_ids"]) for m in logs[0]))
    eos_pos = sum(len(m["token_ids"]) for m in logs[0]) - 2
    teacher_pos = int(source[0, eos_pos])
    assert teacher_pos >= 0
    im_end = base.convert_tokens_to_ids("<|im_end|>")
    assert int(rows.batch["input_ids"][0, teacher_pos + 1]) == im_end
    assert int(rendering.vocab_map().teacher_to_student[im_end]) == student.eos_token_id


def test_a_tokenizer_that_differs_only_in_eos_reads_the_rows_as_they_are(
    real_tokenizer, qwen3_base
):
    assert tokenizer_difference(real_tokenizer("qwen3"), qwen3_base) is None


def test_the_difference_names_the_vocabulary(real_tokenizer):
    difference = tokenizer_difference(real_tokenizer("qwen3"), real_tokenizer("llama3"))
    assert "vocabular" in difference and "bos_token" not in difference


def test_qwen3s_template_is_a_teacher_template(real_tokenizer, rendering):
    """Qwen3's template writes <think>...</think> before the last assistant turn: the teacher
    reads the student's text after its generation prompt, as it would read its own."""
    student, teacher = real_tokenizer("llama3"), real_tokenizer("qwen3")
    rendering("llama3", "qwen3").check()
    logs = _logs(student, [" Four.\n"])
    rows = rendering("llama3", "qwen3").teacher_rows(logs)
    length = int(rows.batch["input_lengths"][0])
    text = teacher.decode(rows.batch["input_ids"][0, :length])
    assert text.endswith("<|im_start|>assistant\n Four.\n<|im_end|>")


def test_a_template_that_refuses_a_system_message_is_refused_at_setup(real_tokenizer):
    student, teacher = real_tokenizer("qwen3"), real_tokenizer("mistral_sp")
    rendering = TeacherRendering(student, ChatFormatter(teacher), system_prompt="Be brief.")
    with pytest.raises(SetupError, match="system"):
        rendering.check()


def test_a_row_that_cannot_be_rendered_is_counted_not_raised(real_tokenizer, rendering):
    """A conversation the teacher's template refuses mid-run (two user turns in a row for
    Mistral's alternation rule) is left ungraded and counted; the other rows are graded."""
    student = real_tokenizer("qwen3")
    good = _logs(student, ["Four."])[0]
    bad = [*good[:-1], {"role": "user", "content": "again", "token_ids": [16, 17]}, good[-1]]
    rows = rendering("qwen3", "mistral_sp").teacher_rows([good, bad])
    width = max(sum(len(m["token_ids"]) for m in log) for log in (good, bad))
    source = rows.source_positions(width)
    assert (source[0] >= 0).any() and (source[1] < 0).all()
    assert rows.unrendered == 1
    batch = flatten_message_logs([good, bad], student.pad_token_id)
    assert Rollouts(batch, [good, bad], [{}, {}]).batch["input_ids"].shape[0] == 2
    assert torch.is_tensor(rows.batch["input_ids"])


def test_chat_template_kwargs_reach_every_rendering(real_tokenizer):
    """policy.tokenizer.chat_template_kwargs ({enable_thinking: false}): the prompts end with
    Qwen3's empty think block, the teacher reads the student's text after it, and a template
    rendered with other variables is another template to setup."""
    qwen = real_tokenizer("qwen3")
    no_thinking = {"enable_thinking": False}
    opening = ChatFormatter(qwen, template_kwargs=no_thinking).prompt_log(PROMPT)
    assert qwen.decode(opening[-1]["token_ids"]).endswith("<think>\n\n</think>\n\n")
    student = real_tokenizer("llama3")
    teacher = ChatFormatter(qwen, template_kwargs=no_thinking)
    rows = TeacherRendering(student, teacher).teacher_rows(_logs(student, ["Four."]))
    text = qwen.decode(rows.batch["input_ids"][0, : int(rows.batch["input_lengths"][0])])
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\nFour.<|im_end|>")
    assert tokenizer_difference(qwen, qwen, None, no_thinking) is not None
    assert tokenizer_difference(qwen, qwen, no_thinking, no_thinking) is None


@pytest.mark.parametrize(("student_name", "teacher_name"), PAIRS)
def test_sampled_log_probs_sum_to_the_teachers_per_turn(
    student_name, teacher_name, real_tokenizer, rendering
):
    """OPD as RL: the student's per-token shares of each turn sum to the teacher's
    log-probability of its content and its end of turn (the chain rule), on hostile text."""
    student = real_tokenizer(student_name)
    logs = _logs(student, HOSTILE_TEXTS)
    rows = rendering(student_name, teacher_name).teacher_rows(logs)
    logprobs = -torch.rand(
        rows.batch["input_ids"].shape, generator=torch.Generator().manual_seed(0)
    )
    width = max(sum(len(m["token_ids"]) for m in log) for log in logs)
    shares = rows.logprobs_to_student(logprobs, width)
    for row, log in enumerate(logs):
        s_start = sum(len(m["token_ids"]) for m in log[:-1])
        t_start = sum(len(m["token_ids"]) for m in rows.logs[row][:-1])
        t_content = len(rows.logs[row][-1]["token_ids"]) - len(rendering_closing(rows, row))
        expected = float(logprobs[row, t_start - 1 : t_start - 1 + t_content].sum())
        got = float(shares[row, s_start - 1 : s_start - 1 + len(log[-1]["token_ids"])].sum())
        assert got == pytest.approx(expected, rel=1e-4), row


def rendering_closing(rows, row):
    """The teacher's ids after its end-of-turn token (the template's text after it)."""
    ids = rows.logs[row][-1]["token_ids"]
    pair = rows.turns[row][-1]
    return ids[pair.num_teacher + 1 :]


def test_a_conversation_too_long_in_the_teachers_tokens_is_cut_and_counted(
    real_tokenizer, rendering
):
    """A Llama 3 student writes a long number in thirds of the tokens a Qwen teacher needs:
    past the teacher's longest row the turn is not graded (no top-k, no end of turn, no share
    of a group the row does not hold), before it as usual."""
    student = real_tokenizer("llama3")
    logs = _logs(student, ["1234567890" * 12])
    full = rendering("llama3", "qwen3").teacher_rows(logs)
    length = int(full.batch["input_lengths"][0])
    limit = length - 60
    cutting = copy.copy(rendering("llama3", "qwen3"))  # its tables shared; its own max_length
    cutting.max_length = limit
    cut = cutting.teacher_rows(logs)
    assert cut.truncated == 1 and int(cut.batch["input_lengths"][0]) == limit
    width = sum(len(m["token_ids"]) for m in logs[0])
    before, after = full.source_positions(width)[0], cut.source_positions(width)[0]
    kept = after >= 0
    assert kept.any() and (after[kept] == before[kept]).all()
    assert int(after.max()) < limit - 1 and int(before.max()) >= limit
    logprobs = -torch.ones(full.batch["input_ids"].shape)
    shares = cut.logprobs_to_student(logprobs[:, :limit], width)[0]
    start = sum(len(m["token_ids"]) for m in logs[0][:-1])
    turn = shares[start - 1 : width - 1]
    assert (turn[: int(kept.sum())] < 0).all() and (turn[-1] == 0).all()
