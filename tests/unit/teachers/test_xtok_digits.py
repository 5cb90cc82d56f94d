"""Where the vocabularies segment the same text differently (digits: Qwen writes one per token,
Llama 3 up to three), the teacher's signal is never wrong (docs/cross_tokenizer.md, "Digits and
merges"):

- Qwen3 student, Llama 3 teacher: the teacher's mass on "121", "12" and "1" is mass on texts
  the student starts with its "1": all of it reaches the student's "1", none is lost.
- Llama 3 student, Qwen3 teacher: the student's "121" spans the teacher's "1", "2", "1"; the
  teacher's top-k at "1" cannot say how much of its mass continues as "121", so the position
  keeps one slot, "121" with the teacher's chain-rule log-prob, and the rest is tail.
- A SentencePiece byte-fallback student: the teacher's "1" reaches its "1", not <0x31>.
"""

import math

import torch

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.losses import EMPTY_INDEX
from nemo_opd.scoring.rendering import TeacherRendering

K = 4


def _rows(student, teacher, response):
    formatter = ChatFormatter(student)
    ids = student(response, add_special_tokens=False)["input_ids"] + [student.eos_token_id]
    log = [*formatter.prompt_log("Compute."), {"role": "assistant", "content": response,
                                              "token_ids": ids}]  # fmt: skip
    rendering = TeacherRendering(student, ChatFormatter(teacher))
    rows = rendering.teacher_rows([log])
    return rendering, rows, log, ids


def _teacher_topk(rows, position, candidates):
    """[1, S_t, K] top-k with `candidates` ({teacher id: prob}) at `position`, elsewhere one
    certain token."""
    width = rows.batch["input_ids"].shape[1]
    values = torch.full((1, width, K), -30.0)
    indices = torch.zeros((1, width, K), dtype=torch.int32)
    values[..., 0] = 0.0
    for slot, (token, prob) in enumerate(candidates.items()):
        values[0, position, slot] = math.log(prob)
        indices[0, position, slot] = token
    return values, indices


def test_a_qwen_student_gets_the_llama_teachers_multi_digit_mass_on_its_digit(real_tokenizer):
    student, teacher = real_tokenizer("qwen3"), real_tokenizer("llama3")
    rendering, rows, log, ids = _rows(student, teacher, "121")
    start = len(log[0]["token_ids"])
    width = start + len(ids)
    source = rows.source_positions(width)
    at = int(source[0, start - 1])  # the teacher's position before its "121"
    assert at >= 0
    one, two = (student.convert_tokens_to_ids(d) for d in "12")
    tok = teacher.convert_tokens_to_ids
    candidates = {tok("121"): 0.5, tok("12"): 0.2, tok("1"): 0.1, tok("2"): 0.1}
    values, indices = _teacher_topk(rows, at, candidates)
    out_values, out_ids = rows.topk_to_student(values, indices, width, rendering.vocab_map())
    got = dict(
        zip(out_ids[0, start - 1].tolist(), out_values[0, start - 1].exp().tolist(), strict=True)
    )
    assert got.keys() - {EMPTY_INDEX} == {one, two}
    assert math.isclose(got[one], 0.8, rel_tol=1e-5) and math.isclose(got[two], 0.1, rel_tol=1e-5)
    # the student's "2" and "1" start inside the teacher's "121": no teacher distribution there
    assert (source[0, start : start + 2] == -1).all()


def test_a_llama_student_keeps_the_chain_rule_log_prob_of_its_multi_digit_token(real_tokenizer):
    student, teacher = real_tokenizer("llama3"), real_tokenizer("qwen3")
    rendering, rows, log, ids = _rows(student, teacher, "121")
    assert len(ids) == 2  # "121" and the end of turn
    start = len(log[0]["token_ids"])
    width = start + len(ids)
    at = int(rows.source_positions(width)[0, start - 1])
    one, two = (teacher.convert_tokens_to_ids(d) for d in "12")
    width_t = rows.batch["input_ids"].shape[1]
    values = torch.full((1, width_t, K), -30.0)
    indices = torch.zeros((1, width_t, K), dtype=torch.int32)
    for position, (token, prob) in zip(
        range(at, at + 3), [(one, 0.6), (two, 0.5), (one, 0.4)], strict=True
    ):
        values[0, position, :2] = torch.tensor([math.log(prob), math.log(1 - prob)])
        indices[0, position, :2] = torch.tensor([token, 99])
    out_values, out_ids = rows.topk_to_student(values, indices, width, rendering.vocab_map())
    assert out_ids[0, start - 1].tolist() == [ids[0]] + [EMPTY_INDEX] * (K - 1)
    assert math.isclose(float(out_values[0, start - 1, 0].exp()), 0.6 * 0.5 * 0.4, rel_tol=1e-5)
    # one of the teacher's tokens outside its top-k: the log-prob is unknown, nothing is said
    indices[0, at + 1, 0] = 99
    indices[0, at + 1, 1] = 98
    rows._sources.clear()
    out_values, out_ids = rows.topk_to_student(values, indices, width, rendering.vocab_map())
    assert (out_ids[0, start - 1] == EMPTY_INDEX).all()


def test_a_sentencepiece_student_gets_its_own_digit_not_its_byte_token(real_tokenizer):
    student, teacher = real_tokenizer("mistral_sp"), real_tokenizer("qwen3")
    vocab = TeacherRendering(student, ChatFormatter(teacher)).vocab_map()
    for digit in "0123456789":
        mapped = int(vocab.teacher_to_student[teacher.convert_tokens_to_ids(digit)])
        assert (
            mapped
            == student.convert_tokens_to_ids(digit)
            != student.convert_tokens_to_ids(f"<0x{ord(digit):02X}>")
        )
