"""PrivilegedContext: the teacher's rows (its own prompt, the student's conversation after it)
and their outputs back in the student's positions, against scoring each concatenation
directly with the tiny teacher's Hugging Face forward (fp32), for ragged prompts and a
multi-turn conversation."""

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from nemo_opd.algorithms.prompts import encode_prompts
from nemo_opd.algorithms.setup_teachers import privileged_context
from nemo_opd.config import load_config
from nemo_opd.data.chat import ChatFormatter
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.errors import SetupError
from nemo_opd.teachers.privileged import PrivilegedContext
from nemo_opd.tiny.assets import resolve_pretrained

K = 5
TEMPLATE = "{prompt}\nA correct solution: {response}"
RECORDS = [
    {"prompt": "What is 3 + 4?", "answer": "7", "response": "3 + 4 = 7. \\boxed{7}"},
    {
        "prompt": "Mia has 9 bags with 28 cards in each. How many cards is that?",
        "answer": "252",
        "response": "9 * 28 = 252. \\boxed{252}",
    },
    {"prompt": "What is 100 - 1?", "answer": "99", "response": "100 - 1 = 99. \\boxed{99}"},
]


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(resolve_pretrained("tiny:tokenizer"))


@pytest.fixture(scope="module")
def teacher():
    path = resolve_pretrained("tiny:teacher")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def assistant(tokenizer, text: str) -> dict:
    ids = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return {"role": "assistant", "content": text, "token_ids": ids}


def conversations(tokenizer) -> list[list[dict]]:
    """Student conversations: one reply each, and for the second a wrong reply, the
    environment's retry message and a second reply (multi-turn)."""
    formatter = ChatFormatter(tokenizer)
    logs = formatter.prompt_logs([r["prompt"] for r in RECORDS])
    logs = [
        log + [assistant(tokenizer, reply)]
        for log, reply in zip(logs, ["7", "9 * 28 = 242.", "99"], strict=True)
    ]
    retry = formatter.extend(logs[1], [{"role": "user", "content": "Try again."}])
    logs[1] = retry + [assistant(tokenizer, "9 * 28 = 252. \\boxed{252}")]
    return logs


def topk(model, batch, k):
    """The teacher contract on a batch: per row, top-k log-probs of every position (position t
    scores token t + 1), 0 past the row's end."""
    values = torch.zeros(*batch["input_ids"].shape, k)
    indices = torch.zeros(*batch["input_ids"].shape, k, dtype=torch.int64)
    with torch.no_grad():
        for row, length in enumerate(batch["input_lengths"].tolist()):
            logits = model(batch["input_ids"][row : row + 1, :length]).logits[0]
            top = torch.log_softmax(logits.float(), -1).topk(k, -1)
            values[row, :length], indices[row, :length] = top.values, top.indices
    return values, indices


def test_the_response_is_scored_after_the_teachers_prompt(tokenizer, teacher):
    logs = conversations(tokenizer)
    context = PrivilegedContext(ChatFormatter(tokenizer), TEMPLATE)
    rows = context.teacher_rows(logs, RECORDS, tokenizer.pad_token_id)
    student = flatten_message_logs(logs, tokenizer.pad_token_id)
    width = student["input_ids"].shape[1]
    values, indices = (rows.to_student(t, width) for t in topk(teacher, rows.batch, K))

    teacher_formatter = ChatFormatter(tokenizer)
    for row, (log, record) in enumerate(zip(logs, RECORDS, strict=True)):
        # Directly: the teacher's opening for this record, then the student's tokens from its
        # first assistant message on.
        opening = teacher_formatter.prompt_log(TEMPLATE.format(**record))
        first = next(i for i, m in enumerate(log) if m["role"] == "assistant")
        student_prompt = [t for m in log[:first] for t in m["token_ids"]]
        after = [t for m in log[first:] for t in m["token_ids"]]
        direct = [t for m in opening for t in m["token_ids"]] + after
        with torch.no_grad():
            logits = teacher(torch.tensor([direct])).logits[0]
        direct_top = torch.log_softmax(logits, -1).topk(K, -1)
        q, p = len(direct) - len(after), len(student_prompt)
        # The student position predicting the j-th token after its prompt is p - 1 + j; the
        # teacher's is q - 1 + j.
        for j in range(len(after)):
            torch.testing.assert_close(values[row, p - 1 + j], direct_top.values[q - 1 + j])
            assert torch.equal(indices[row, p - 1 + j], direct_top.indices[q - 1 + j])
        assert not values[row, : p - 1].any()  # inside the student's prompt: never trained
        assert not values[row, p + len(after) :].any()  # past the row's end
    # The privileged prompt is longer than the student's, by a different amount in each row.
    shifts = (rows.teacher_opening - rows.student_opening).tolist()
    assert min(shifts) > 0 and len(set(shifts)) > 1


def test_a_template_with_other_fields_is_refused(tokenizer):
    with pytest.raises(ValueError, match=r"names \{solution\}"):
        PrivilegedContext(ChatFormatter(tokenizer), "{prompt} {solution}")


def test_longest_growth_is_the_largest_shift_of_the_rows(tokenizer):
    formatter = ChatFormatter(tokenizer)
    context = PrivilegedContext(formatter, TEMPLATE)
    samples = encode_prompts(
        [{**record} for record in RECORDS], formatter, max_tokens=100, where="train"
    ).samples
    growth, index = context.longest_growth(samples)
    rows = context.teacher_rows(conversations(tokenizer), RECORDS, tokenizer.pad_token_id)
    shifts = (rows.teacher_opening - rows.student_opening).tolist()
    assert (growth, index) == (max(shifts), shifts.index(max(shifts)))


def test_a_served_teacher_with_its_own_prompt_must_fit_its_context(tokenizer):
    """The served teacher's rows are longer than the student's by its opening; the run is
    refused at setup when they would not fit teacher.max_total_sequence_length (its server's
    context), rather than failing with the server's 400 mid-run."""
    config = Path(__file__).resolve().parents[3] / "examples/configs/distillation_tiny.yaml"
    served = [
        "teacher.server.enabled=true",
        "teacher.server.base_url=http://127.0.0.1:9/v1",
        f"teacher.prompt_template='{TEMPLATE}'",
    ]
    formatter = ChatFormatter(tokenizer)
    prompts = encode_prompts(RECORDS, formatter, max_tokens=100, where="train")
    growth, _ = PrivilegedContext(formatter, TEMPLATE).longest_growth(prompts.samples)
    cfg = load_config(config, served)
    needed = cfg.policy.max_total_sequence_length + growth
    with pytest.raises(SetupError, match=rf"set teacher.max_total_sequence_length={needed} and"):
        privileged_context(cfg, formatter, [prompts])
    fits = load_config(config, [*served, f"teacher.max_total_sequence_length={needed}"])
    assert privileged_context(fits, formatter, [prompts]).template == TEMPLATE
    in_process = load_config(config, [f"teacher.prompt_template='{TEMPLATE}'"])
    assert privileged_context(in_process, formatter, [prompts]) is not None  # not its limit
