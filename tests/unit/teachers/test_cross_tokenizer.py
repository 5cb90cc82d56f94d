"""CrossTokenizerTeacher around a real model teacher in this process.

- With the student's own tokenizer and template it gives exactly what the teacher gives on the
  student's rows (the identity case of the cross-tokenizer path).
- With a byte-level tokenizer and another chat template, the teacher reads the conversation as
  its own template writes it, grades every student token that starts on one of its token
  boundaries with its top-k moved onto the student's ids, and its per-token log-probs of the
  student's text sum, per turn, to its log-probability of that text and its end of turn.
- A conversation the teacher's template cannot render is left ungraded and counted, a bug in
  the rendering or the alignment is raised, and more than teacher.max_unrendered_share of a
  step's rows unrendered ends the run.
"""

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config

from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.errors import RunError, SetupError
from nemo_opd.losses import EMPTY_INDEX
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.scoring.rendering import TeacherRendering
from nemo_opd.teachers.cross_tokenizer import CrossTokenizerTeacher
from nemo_opd.tiny import resolve_pretrained

PROMPTS = ["What is 12 + 7?", "Mia has 36 pens and gives away 5. How many pens are left?"]
RESPONSES = ["12 + 7 = 19. \\boxed{19}", "36 - 5 = 31. \\boxed{31}"]
BYTE_TEMPLATE = (  # chat templates trim the newline after a block tag: "\n" as expressions
    "{% for m in messages %}### {{ m['role'] }}:{{ '\\n' }}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<eot>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}### assistant:{{ '\\n' }}{% endif %}"
)


class ModelTeacher:
    """The Teacher interface over a Hugging Face model in this process (float32, no Ray)."""

    def __init__(self, model):
        self.model = model.eval()

    @torch.no_grad()
    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        ids, lengths = rollouts.batch["input_ids"], rollouts.batch["input_lengths"]
        logp = torch.log_softmax(self.model(input_ids=ids).logits.float() / need.temperature, -1)
        past = torch.arange(ids.shape[1]) >= lengths.unsqueeze(1)
        scores = TeacherScores()
        if need.topk:
            values, indices = logp.topk(need.topk, dim=-1)
            scores.topk_logprobs = values.masked_fill(past.unsqueeze(-1), 0.0)
            scores.topk_indices = indices.to(torch.int32).masked_fill(past.unsqueeze(-1), 0)
        if need.sampled:
            nxt = torch.roll(ids, -1, dims=1).unsqueeze(-1)
            scores.logprobs = logp.gather(-1, nxt).squeeze(-1).masked_fill(past, 0.0)
        return scores

    def workers(self):
        return {}

    def groups(self, metadata):
        return {}

    def take_metrics(self):
        return {}

    def shutdown(self):
        pass


def _byte_tokenizer() -> PreTrainedTokenizerFast:
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok)
    wrapped.add_special_tokens({"eos_token": "<eot>", "pad_token": "<pad>"})
    wrapped.chat_template = BYTE_TEMPLATE
    return wrapped


def _random_model(vocab: int, seed: int):
    torch.manual_seed(seed)
    config = Qwen3Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
    )  # fmt: skip
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # sharper distributions than a random init's
    return model


@pytest.fixture(scope="module")
def student():
    tokenizer = AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer"))
    formatter = ChatFormatter(tokenizer)
    logs = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        log = formatter.prompt_log(prompt)
        ids = tokenizer.encode(response, add_special_tokens=False) + [tokenizer.eos_token_id]
        logs.append([*log, {"role": "assistant", "content": response, "token_ids": ids}])
    batch = flatten_message_logs(logs, tokenizer.pad_token_id)
    return tokenizer, formatter, Rollouts(batch, logs, [{} for _ in logs])


def test_the_students_own_tokenizer_gives_the_teachers_scores_unchanged(student):
    tokenizer, formatter, rollouts = student
    teacher = ModelTeacher(_random_model(len(tokenizer), seed=1))
    rendering = TeacherRendering(tokenizer, formatter)
    crossed = CrossTokenizerTeacher(teacher, rendering)
    need = TeacherNeed(topk=8, sampled=True)
    direct, mapped = teacher.score(rollouts, need), crossed.score(rollouts, need)
    graded = rollouts.batch["token_mask"].roll(-1, dims=1) > 0  # positions predicting a turn
    torch.testing.assert_close(mapped.logprobs[graded], direct.logprobs[graded])
    torch.testing.assert_close(mapped.topk_logprobs[graded], direct.topk_logprobs[graded])
    assert torch.equal(mapped.topk_indices[graded], direct.topk_indices[graded])
    assert not mapped.topk_indices[~graded].ne(EMPTY_INDEX).any()
    metrics = crossed.take_metrics()
    assert metrics["teacher/xtok_mapped_mass"] == pytest.approx(1.0)
    assert metrics["teacher/xtok_graded_share"] == 1.0


def test_a_teacher_with_another_tokenizer_and_template(student):
    tokenizer, formatter, rollouts = student
    byte_tok = _byte_tokenizer()
    teacher = ModelTeacher(_random_model(len(byte_tok), seed=2))
    rendering = TeacherRendering(tokenizer, ChatFormatter(byte_tok))
    vocab = rendering.vocab_map()
    rows = rendering.teacher_rows(rollouts.message_logs)
    for row, (prompt, response) in enumerate(zip(PROMPTS, RESPONSES, strict=True)):
        length = int(rows.batch["input_lengths"][row])
        text = byte_tok.decode(rows.batch["input_ids"][row, :length], skip_special_tokens=False)
        assert text == f"### user:\n{prompt}\n### assistant:\n{response}<eot>"

    crossed = CrossTokenizerTeacher(teacher, rendering)
    need = TeacherNeed(topk=8, sampled=True)
    mapped = crossed.score(rollouts, need)
    direct = teacher.score(Rollouts(rows.batch, rows.logs, rollouts.metadata), need)
    width = rollouts.batch["input_ids"].shape[1]
    source = rows.source_positions(width)
    for row in range(len(RESPONSES)):
        # the tiny tokenizer writes " + " or "12" as one token; bytes split them, so every
        # student token starts on a byte boundary and is graded
        turn = rollouts.batch["token_mask"][row].roll(-1) > 0
        assert (source[row][turn] >= 0).all()
        # the student's per-token shares sum to the teacher's log-prob of the text and <eot>
        teacher_turn = rows.batch["token_mask"][row].roll(-1) > 0
        assert float(mapped.logprobs[row][turn].sum()) == pytest.approx(
            float(direct.logprobs[row][teacher_turn].sum()), rel=1e-5
        )
        # each graded position's ids are the teacher's candidates that name a student token;
        # where the student's token spans several teacher tokens, at most the sampled one
        ids = rollouts.batch["input_ids"][row]
        for position in turn.nonzero().flatten().tolist():
            teacher_ids = direct.topk_indices[row, source[row, position]].tolist()
            got = set(mapped.topk_indices[row, position].tolist()) - {EMPTY_INDEX}
            sampled = int(ids[position + 1])
            if sampled != tokenizer.eos_token_id and len(tokenizer.decode([sampled]).encode()) > 1:
                assert got <= {sampled}
            else:
                assert got == {int(vocab.teacher_to_student[t]) for t in teacher_ids} - {-1}
            kept = mapped.topk_logprobs[row, position].exp().sum()
            assert (
                float(kept)
                <= float(direct.topk_logprobs[row, source[row, position]].exp().sum()) + 1e-6
            )
    metrics = crossed.take_metrics()
    assert 0.0 < metrics["teacher/xtok_mapped_mass"] <= 1.0
    assert metrics["teacher/xtok_graded_share"] == 1.0  # bytes are finer than every token
    assert not math.isnan(metrics["teacher/xtok_mapped_mass"])


def test_a_teacher_with_coarser_tokens_grades_only_its_boundaries(student):
    """Student in bytes, teacher in the tiny BPE: a byte inside one of the teacher's tokens has
    no teacher distribution (all slots empty); the others are graded; the log-probs still sum
    to the teacher's log-probability of each turn."""
    tiny, tiny_formatter, _ = student
    byte_tok = _byte_tokenizer()
    formatter = ChatFormatter(byte_tok)
    logs = []
    for prompt, response in zip(PROMPTS, RESPONSES, strict=True):
        ids = byte_tok.encode(response, add_special_tokens=False) + [byte_tok.eos_token_id]
        logs.append([*formatter.prompt_log(prompt), {"role": "assistant", "content": response,
                                                       "token_ids": ids}])  # fmt: skip
    rollouts = Rollouts(flatten_message_logs(logs, byte_tok.pad_token_id), logs, [{}, {}])
    rendering = TeacherRendering(byte_tok, tiny_formatter)
    crossed = CrossTokenizerTeacher(ModelTeacher(_random_model(len(tiny), seed=3)), rendering)
    mapped = crossed.score(rollouts, TeacherNeed(topk=8, sampled=True))
    rows = rendering.teacher_rows(logs)
    direct = ModelTeacher(crossed.inner.model).score(
        Rollouts(rows.batch, rows.logs, [{}, {}]), TeacherNeed(sampled=True)
    )
    for row in range(len(RESPONSES)):
        turn = rollouts.batch["token_mask"][row].roll(-1) > 0
        teacher_turn = rows.batch["token_mask"][row].roll(-1) > 0
        assert float(mapped.logprobs[row][turn].sum()) == pytest.approx(
            float(direct.logprobs[row][teacher_turn].sum()), rel=1e-5
        )
        empty = (mapped.topk_indices[row][turn] == EMPTY_INDEX).all(-1)
        assert 0 < int(empty.sum()) < int(turn.sum())  # "12" is one teacher token, two bytes
    share = crossed.take_metrics()["teacher/xtok_graded_share"]
    assert 0.3 < share < 1.0


def test_text_the_teacher_cannot_write_is_named(student):
    tiny, _, _ = student
    words = Tokenizer(models.WordLevel({"<unk>": 0, "What": 1, "is": 2}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    word_tok = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>")
    word_tok.chat_template = BYTE_TEMPLATE
    unspellable = TeacherRendering(tiny, ChatFormatter(word_tok)).unspellable()
    assert "7" in unspellable and "What" not in unspellable
    assert TeacherRendering(tiny, ChatFormatter(_byte_tokenizer())).unspellable() == []


def test_the_loss_and_its_gradient_are_todays_with_one_tokenizer(student):
    """With the student's own tokenizer the cross-tokenizer path's top-k gives the loss and
    gradient of the teacher's own top-k, to fp32 noise."""
    from nemo_opd.losses import DistillationLossFn, TopkKLParams

    tokenizer, formatter, rollouts = student
    teacher = ModelTeacher(_random_model(len(tokenizer), seed=4))
    rendering = TeacherRendering(tokenizer, formatter)
    crossed = CrossTokenizerTeacher(teacher, rendering)
    need = TeacherNeed(topk=8)
    mask = rollouts.batch["token_mask"].roll(-1, dims=1)  # positions predicting the turns
    logits = torch.randn(*mask.shape, len(tokenizer), generator=torch.Generator().manual_seed(5))
    results = []
    for scores in (teacher.score(rollouts, need), crossed.score(rollouts, need)):
        z = logits.clone().requires_grad_()
        fields = {
            "teacher_topk_logprobs": scores.topk_logprobs,
            "teacher_topk_indices": scores.topk_indices,
            "loss_mask": mask,
        }
        loss_fn = DistillationLossFn(params=TopkKLParams(kl_type="reverse"))
        loss, _ = loss_fn(z, fields, float(mask.sum()))
        loss.backward()
        results.append((loss.detach(), z.grad))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])


def test_the_teacher_reads_the_students_text_whatever_its_template_does_to_content(student):
    """The student's bytes follow the teacher's generation prompt verbatim (as the teacher would
    read its own sampled text), even where its template rewrites a finished turn's content; a
    template that drops the content is refused at setup."""
    tiny, _, rollouts = student
    shouting = _byte_tokenizer()
    shouting.chat_template = BYTE_TEMPLATE.replace(
        "{{ m['content'] }}", "{{ m['content'] | upper }}"
    )
    rendering = TeacherRendering(tiny, ChatFormatter(shouting))
    rendering.check()
    rows = rendering.teacher_rows(rollouts.message_logs[:1])
    length = int(rows.batch["input_lengths"][0])
    text = shouting.decode(rows.batch["input_ids"][0, :length], skip_special_tokens=False)
    assert text.endswith(f"### assistant:\n{RESPONSES[0]}<eot>")
    silent = _byte_tokenizer()
    silent.chat_template = BYTE_TEMPLATE.replace("{{ m['content'] }}", "")
    with pytest.raises(SetupError, match="does not write an assistant turn's content"):
        TeacherRendering(tiny, ChatFormatter(silent)).check()


REFUSING_TEMPLATE = (  # the byte template, refusing a user message that says "refuse"
    "{% for m in messages %}{% if 'refuse' in m['content'] %}"
    "{{ raise_exception('this template refuses that message') }}{% endif %}"
    "### {{ m['role'] }}:{{ '\\n' }}{{ m['content'] }}"
    "{% if m['role'] == 'assistant' %}<eot>{% endif %}{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}### assistant:{{ '\\n' }}{% endif %}"
)


def _with_user_text(log: list[dict], text: str) -> list[dict]:
    """The conversation with its user message's text replaced (its student ids kept: what the
    teacher renders is the text)."""
    return [dict(m, content=text) if m["role"] == "user" else m for m in log]


def _refusing_teacher(student, share: float) -> tuple[CrossTokenizerTeacher, list]:
    """A cross-tokenizer teacher whose template refuses "refuse", and 8 conversations: the
    two of the student fixture, each four times."""
    tokenizer, _, rollouts = student
    refusing = _byte_tokenizer()
    refusing.chat_template = REFUSING_TEMPLATE
    teacher = ModelTeacher(_random_model(len(refusing), seed=6))
    rendering = TeacherRendering(tokenizer, ChatFormatter(refusing))
    rendering.check()
    crossed = CrossTokenizerTeacher(teacher, rendering, max_unrendered_share=share)
    return crossed, rollouts.message_logs * 4


def _score_logs(crossed: CrossTokenizerTeacher, logs: list, pad: int) -> TeacherScores:
    batch = flatten_message_logs(logs, pad)
    return crossed.score(Rollouts(batch, logs, [{}] * len(logs)), TeacherNeed(topk=4))


def test_conversations_the_template_refuses_are_counted_and_too_many_end_the_run(student):
    """Rows the template refuses (its raise_exception) and rows with text no tokenizer encodes
    (a lone surrogate, as a tool result can echo) are ungraded and counted; up to
    max_unrendered_share of a step's rows the run goes on, past it take_metrics ends it with
    one line naming the key."""
    pad = student[0].pad_token_id
    crossed, logs = _refusing_teacher(student, share=0.25)
    logs[1] = _with_user_text(logs[1], "please refuse")
    logs[5] = _with_user_text(logs[5], "a lone \ud800 surrogate")
    scores = _score_logs(crossed, logs, pad)
    assert (
        scores.topk_indices[1].eq(EMPTY_INDEX).all()
        and scores.topk_indices[5].eq(EMPTY_INDEX).all()
    )
    assert scores.topk_indices[0].ne(EMPTY_INDEX).any()
    assert crossed.take_metrics()["teacher/xtok_unrendered_rows"] == 2.0  # 2 of 8: the run goes on
    logs[2] = _with_user_text(logs[2], "refuse this too")
    _score_logs(crossed, logs[:4], pad)  # a step scored in two parts: 3 of 8 unrendered
    _score_logs(crossed, logs[4:], pad)
    with pytest.raises(RunError) as raised:
        crossed.take_metrics()
    message = str(raised.value)
    assert "could not render 3 of the 8 conversations of this step (38%" in message
    assert "teacher.max_unrendered_share 0.25" in message and "\n" not in message
    crossed.shutdown()  # the Teacher interface: the inner teacher's workers stop


def test_a_bug_in_the_alignment_is_raised_not_counted(student, monkeypatch):
    """An exception that real text does not raise (here an IndexError put into the alignment)
    ends the scoring where it happens, instead of leaving the rows ungraded."""
    import nemo_opd.scoring.rendering as rendering

    crossed, logs = _refusing_teacher(student, share=1.0)

    def broken(*args):
        raise IndexError("index 7 is out of bounds for axis 0 with size 7")

    monkeypatch.setattr(rendering, "sources", broken)
    with pytest.raises(IndexError, match="out of bounds"):
        _score_logs(crossed, logs, student[0].pad_token_id)
