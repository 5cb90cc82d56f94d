"""Setup checks of a served teacher against the live server, each a SetupError naming the URL
and what to do: not reachable (after retries), the model not served, a context shorter than the
run's sequences, fewer log-probs than the run's top-k, a tokenizer that differs from the
student's."""

from __future__ import annotations

import time

import httpx
import torch
from transformers import PreTrainedTokenizerBase

from nemo_opd.errors import SetupError
from nemo_opd.secrets import redact_text
from nemo_opd.teachers.served import ServedTeacher, backoff

START_COMMAND = "python -m nemo_opd.teacher_server --config CONFIG"
PROBE_TEXTS = ("What is 12 + 345?", "  The answer is \\boxed{6.5}.\n", "Ünïcödé, tabs\tand 😀")


def check_served_teacher(
    teacher: ServedTeacher,
    *,
    topk: int,
    max_sequence_length: int,
    tokenizer: PreTrainedTokenizerBase,
) -> None:
    """Check the server behind `teacher` can score this run; SetupError if not."""
    listed = _models(teacher)
    served = {model.get("id"): model for model in listed.get("data", [])}
    if teacher.model not in served:
        raise SetupError(
            f"teacher.server: {teacher.shown_url} serves {sorted(served)}, not "
            f"{teacher.model!r}; set teacher.server.model_name to the served name"
        )
    context = served[teacher.model].get("max_model_len")
    if context is not None and context < max_sequence_length + 1:
        raise SetupError(
            f"teacher.server: {teacher.shown_url} serves {teacher.model!r} with a context of "
            f"{context} tokens, but the run scores sequences of up to {max_sequence_length} "
            f"(teacher.max_total_sequence_length) plus one; restart it with --max-model-len >= "
            f"{max_sequence_length + 1} ({START_COMMAND} does)"
        )
    _check_tokenizer(teacher, tokenizer)
    _check_logprobs(teacher, topk, tokenizer)


def _models(teacher: ServedTeacher) -> dict:
    """GET /models, retried like scoring requests."""
    url = f"{teacher.base_url}/models"
    failure = ""
    for attempt in range(teacher.max_retries + 1):
        try:
            response = httpx.get(url, timeout=teacher.timeout_s, headers=teacher.headers)
            if response.status_code < 400:
                return response.json()
            failure = f"HTTP {response.status_code}"
        except (httpx.HTTPError, ValueError) as error:
            failure = f"{type(error).__name__}: {error}"
        if attempt < teacher.max_retries:
            time.sleep(backoff(teacher.backoff_s, attempt))
    raise SetupError(
        f"teacher.server: no teacher server answers at {teacher.shown_url} "
        f"({teacher.max_retries} retries; last: {failure}); start one ({START_COMMAND}) or "
        "set teacher.server.base_url"
    )


def _check_tokenizer(teacher: ServedTeacher, tokenizer: PreTrainedTokenizerBase) -> None:
    """The server tokenizes probe texts to the same ids as the tokenizer the run reads the
    teacher with."""
    root = teacher.base_url.removesuffix("/v1")
    for text in PROBE_TEXTS:
        body = {"model": teacher.model, "prompt": text, "add_special_tokens": False}
        try:
            served = httpx.post(
                f"{root}/tokenize", json=body, timeout=teacher.timeout_s, headers=teacher.headers
            )
            served_ids = served.json()["tokens"]
        except (httpx.HTTPError, ValueError, KeyError) as error:
            raise SetupError(
                f"teacher.server: {redact_text(root)}/tokenize did not answer ({error}); the "
                "served teacher "
                "needs a vLLM OpenAI-compatible server"
            ) from error
        ids = tokenizer.encode(text, add_special_tokens=False)
        if served_ids != ids:
            raise SetupError(
                f"teacher.server: the served model's tokenizer differs from the one the run "
                f"reads the teacher with (teacher.tokenizer, or the student's when they are "
                f"the same): {text!r} is {served_ids} there and {ids} here; serve the model "
                "whose tokenizer teacher.tokenizer names"
            )


def _check_logprobs(teacher: ServedTeacher, topk: int, tokenizer: PreTrainedTokenizerBase) -> None:
    """One real scoring request at the run's top-k: the server's --max-logprobs allows it."""
    ids = tokenizer.encode(PROBE_TEXTS[0], add_special_tokens=False)
    batch = {"input_ids": torch.tensor([ids]), "input_lengths": torch.tensor([len(ids)])}
    try:
        teacher.get_topk_logits(batch, topk)
    except Exception as error:  # noqa: BLE001 - reported with the server's own words
        raise SetupError(
            f"teacher.server: {teacher.shown_url} cannot return the top {topk} log-probs "
            f"(distillation.topk_logits_k): {error}; restart it with --max-logprobs >= {topk} "
            f"({START_COMMAND} does)"
        ) from error
