"""A teacher behind vLLM's OpenAI-compatible server, scored over HTTP.

    teacher = ServedTeacher("http://127.0.0.1:8000/v1", "tiny-teacher")
    values, indices = teacher.get_topk_logits(batch, k=16)   # [B, S, k] fp32, [B, S, k] int32
    logprobs = teacher.get_logprobs(batch)                   # [B, S] fp32

The same results, layout and dtypes as the in-process teacher (Policy.get_topk_logits and
get_logprobs), so the loss cannot tell them apart: position t scores the distribution of token
t + 1; top-k values are log-probs over the full vocabulary, descending; positions at or beyond a
row's length are 0 (and for get_logprobs also its last position, which has no next token).

How: each row's token ids go to /v1/completions as the prompt (no re-tokenization) with
`prompt_logprobs` = k, `max_tokens` 1 and `logprobs` = k. vLLM answers, for every prompt
position i >= 1, the top-k log-probs of token i given tokens < i plus the log-prob of the token
that is there (its rank says whether it is in the top k), which gives positions 0 .. L-2; the
one generated token's top-k (ids kept with `return_tokens_as_token_ids`) gives position L-1.
vLLM computes prompt log-probs from the raw logits, so only temperature 1 can be served.

Requests go out concurrently through one httpx.AsyncClient, at most `max_concurrency` at a time,
`rows_per_request` rows each, and come back in row order. A connection error, a timeout or a
5xx is retried with exponential backoff (counted in `retries`); once `max_retries` retries of
one request have failed, ServedTeacherError names the URL and what to do. A 4xx (a request the
server refuses, e.g. more log-probs than its --max-logprobs) fails at once with the server's
message.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import httpx
import torch

from nemo_opd.errors import ServiceError
from nemo_opd.scoring.base import Rollouts, TeacherNeed, TeacherScores
from nemo_opd.secrets import redact_text
from nemo_opd.teachers.base import score_with

MAX_BACKOFF_S = 60.0
"""The longest wait between two retries (the waits double from retry_backoff_s up to it)."""


def backoff(first_s: float, attempt: int) -> float:
    """Seconds before retry `attempt` + 1: first_s doubled per attempt, at most MAX_BACKOFF_S."""
    return min(MAX_BACKOFF_S, first_s * 2 ** min(attempt, 64))


class ServedTeacherError(ServiceError):
    """The teacher's server could not score a batch (down, refusing, or answering nonsense)."""


@dataclass(frozen=True)
class _Request:
    rows: Sequence[int]
    k: int  # top-k asked for; 0: only the log-prob of the token at each position


class ServedTeacher:
    """Scores token ids with a model served by vLLM's OpenAI-compatible server.

    Args:
        base_url: the server's OpenAI base URL, e.g. "http://127.0.0.1:8000/v1".
        model: the served model name (vLLM's --served-model-name).
        timeout_s: seconds one request may take.
        max_concurrency: requests in flight at once.
        max_retries: retries of one request after a connection error, timeout or 5xx.
        backoff_s: the first retry's wait; each further retry waits twice as long, at most
            MAX_BACKOFF_S.
        rows_per_request: rows sent in one request (vLLM batches them).
        api_key: sent as `Authorization: Bearer <api_key>` (vLLM's --api-key); None: none.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        timeout_s: float = 120.0,
        max_concurrency: int = 8,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        rows_per_request: int = 8,
        api_key: str | None = None,
    ) -> None:
        if max_concurrency < 1 or rows_per_request < 1 or max_retries < 0:
            raise ValueError(
                "max_concurrency and rows_per_request must be >= 1 and max_retries >= 0"
            )
        self.base_url = base_url.rstrip("/")
        self.shown_url = redact_text(self.base_url)
        """base_url as messages show it: without user-info (nemo_opd.secrets)."""
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.model = model
        self.timeout_s = timeout_s
        self.max_concurrency = max_concurrency
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.rows_per_request = rows_per_request
        self.retries = 0
        """Requests retried so far (connection errors, timeouts, 5xx)."""
        self._retries_reported = 0

    # ---------------------------------------------------------------- the Teacher interface

    def score(self, rollouts: Rollouts, need: TeacherNeed) -> TeacherScores:
        return score_with(self.get_topk_logits, self.get_logprobs, rollouts, need)

    def workers(self) -> dict:
        return {}  # the server runs on its own

    def groups(self, metadata: list[dict]) -> dict[str, torch.Tensor]:
        return {}

    def take_metrics(self) -> dict[str, float]:
        """teacher/server_retries: requests retried since the last call."""
        retried, self._retries_reported = self.retries - self._retries_reported, self.retries
        return {"teacher/server_retries": float(retried)}

    def shutdown(self) -> None:
        pass  # nothing of the server's is this run's to stop

    # ---------------------------------------------------------------- render workers

    def split(self, parts: int) -> list[ServedTeacher]:
        """`parts` copies of this client, one per render worker (nemo_opd.scoring.render_pool),
        that share max_concurrency between them (at least one request each), with retries
        counted from 0."""
        copies = []
        for part in range(parts):
            piece = copy.copy(self)
            share = self.max_concurrency // parts + (part < self.max_concurrency % parts)
            piece.max_concurrency = max(1, share)
            piece.retries = piece._retries_reported = 0
            copies.append(piece)
        return copies

    def longest_wait_s(self, rows: int) -> float:
        """The most seconds scoring `rows` rows can wait on the server before the retries run
        out (ServedTeacherError): its requests in rounds of max_concurrency, each request every
        attempt's wait (the connection and the answer may each take timeout_s) and the backoffs
        between them."""
        requests = -(-rows // self.rows_per_request)
        rounds = -(-requests // self.max_concurrency)
        backoffs = sum(backoff(self.backoff_s, attempt) for attempt in range(self.max_retries))
        return rounds * ((self.max_retries + 1) * 2 * self.timeout_s + backoffs)

    # ---------------------------------------------------------------- scoring

    def get_topk_logits(
        self, data: Mapping, k: int, temperature: float = 1.0
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k log-probs over the full vocabulary [B, S, k] fp32 (descending) and their ids
        [B, S, k] int32; position t scores the distribution of token t + 1; 0 at or beyond
        each row's length."""
        _check_temperature(temperature)
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        input_ids, lengths = data["input_ids"], data["input_lengths"]
        values = torch.zeros((*input_ids.shape, k), dtype=torch.float32)
        indices = torch.zeros((*input_ids.shape, k), dtype=torch.int32)
        for row, choice in self._score_rows(input_ids, lengths, k):
            with self._reading(row):
                length = int(lengths[row])
                for t, entries in enumerate(choice["prompt_logprobs"][1:length]):
                    top = _top_entries(entries, k, row, t)
                    values[row, t] = torch.tensor([logprob for _, logprob in top])
                    indices[row, t] = torch.tensor([token for token, _ in top], dtype=torch.int32)
                last = _last_position_top(choice, k, row)
                values[row, length - 1] = torch.tensor([logprob for _, logprob in last])
                ids = [token for token, _ in last]
                indices[row, length - 1] = torch.tensor(ids, dtype=torch.int32)
        return values, indices

    def get_logprobs(self, data: Mapping, temperature: float = 1.0) -> torch.Tensor:
        """[B, S] fp32: position t holds log p(token t + 1 | tokens <= t); 0 at
        t >= length - 1."""
        _check_temperature(temperature)
        input_ids, lengths = data["input_ids"], data["input_lengths"]
        out = torch.zeros(input_ids.shape, dtype=torch.float32)
        for row, choice in self._score_rows(input_ids, lengths, 0):
            with self._reading(row):
                length = int(lengths[row])
                tokens = input_ids[row, :length].tolist()
                for t, entries in enumerate(choice["prompt_logprobs"][1:length]):
                    entry = (entries or {}).get(str(tokens[t + 1]))
                    if entry is None:
                        raise ServedTeacherError(
                            f"{self.shown_url}: no log-prob for token {tokens[t + 1]} at "
                            f"position {t + 1} of row {row}"
                        )
                    out[row, t] = entry["logprob"]
        return out

    @contextlib.contextmanager
    def _reading(self, row: int):
        """Turn a reply of the wrong shape (missing fields, wrong types) into ServedTeacherError."""
        try:
            yield
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as error:
            raise ServedTeacherError(
                f"{self.shown_url} sent a malformed reply for row {row} "
                f"({type(error).__name__}: {error}); is it vLLM's OpenAI-compatible server?"
            ) from error

    # ---------------------------------------------------------------- requests

    def _score_rows(self, input_ids: torch.Tensor, lengths: torch.Tensor, k: int) -> list:
        """[(row, choice)] for every row of the batch, in row order."""
        rows = list(range(input_ids.shape[0]))
        chunks = [
            _Request(rows[i : i + self.rows_per_request], k)
            for i in range(0, len(rows), self.rows_per_request)
        ]
        prompts = [input_ids[row, : int(lengths[row])].tolist() for row in rows]
        answers = asyncio.run(self._send_all(chunks, prompts))
        return [pair for answer in answers for pair in answer]

    async def _send_all(self, requests: list[_Request], prompts: list[list[int]]) -> list:
        limit = asyncio.Semaphore(self.max_concurrency)
        async with httpx.AsyncClient(timeout=self.timeout_s, headers=self.headers) as client:

            async def send(request: _Request) -> list:
                async with limit:
                    return await self._send(client, request, prompts)

            return await asyncio.gather(*(send(request) for request in requests))

    async def _send(self, client: httpx.AsyncClient, request: _Request, prompts: list) -> list:
        """[(row, choice)] of one request, retried on connection errors, timeouts and 5xx."""
        body = {
            "model": self.model,
            "prompt": [prompts[row] for row in request.rows],
            "max_tokens": 1,
            "temperature": 0.0,
            "prompt_logprobs": request.k,
            "logprobs": max(request.k, 1),
            "return_tokens_as_token_ids": True,
        }
        url = f"{self.base_url}/completions"
        shown = f"{self.shown_url}/completions"
        for attempt in range(self.max_retries + 1):
            try:
                response = await client.post(url, json=body)
            except httpx.TransportError as error:  # refused, dropped, timed out
                failure = f"{type(error).__name__}: {error}"
            else:
                if response.status_code < 400:
                    return _choices_in_order(_json_body(response, shown), request.rows, shown)
                if response.status_code < 500:
                    raise ServedTeacherError(
                        f"{shown} refused the request ({response.status_code}): "
                        f"{_server_message(response)}"
                    )
                failure = f"HTTP {response.status_code}: {_server_message(response)}"
            if attempt == self.max_retries:
                break
            self.retries += 1
            await asyncio.sleep(backoff(self.backoff_s, attempt))
        raise ServedTeacherError(
            f"the teacher server at {self.shown_url} did not answer after {self.max_retries} "
            f"retries (last: {failure}); check that it is running (python -m "
            "nemo_opd.teacher_server) and reachable, then run the same command again"
        )


def _check_temperature(temperature: float) -> None:
    if temperature != 1.0:
        raise ValueError(
            "a served teacher scores at temperature 1 only (vLLM's prompt log-probs come from "
            f"the raw logits); got {temperature}"
        )


def _json_body(response: httpx.Response, url: str) -> dict:
    """The JSON object of a successful reply; ServedTeacherError for anything else."""
    try:
        payload = response.json()
    except ValueError as error:  # JSONDecodeError, and bodies that are not UTF-8
        raise ServedTeacherError(
            f"{url} answered {response.status_code} with a body that is not JSON ({error}): "
            f"{response.text[:200]!r}"
        ) from error
    if not isinstance(payload, dict):
        raise ServedTeacherError(f"{url} answered JSON that is not an object: {str(payload)[:200]}")
    return payload


def _choices_in_order(payload: dict, rows: Sequence[int], url: str) -> list:
    """[(row, choice)] in the request's row order (the server may answer in any order)."""
    choices = payload.get("choices")
    if not isinstance(choices, list) or not all(
        isinstance(c, dict) and isinstance(c.get("index"), int) for c in choices
    ):
        raise ServedTeacherError(f"{url} answered without a list of indexed choices")
    choices = sorted(choices, key=lambda choice: choice["index"])
    if len(choices) != len(rows):
        raise ServedTeacherError(f"{url} answered {len(choices)} choices for {len(rows)} prompts")
    return list(zip(rows, choices, strict=True))


def _top_entries(entries: dict | None, k: int, row: int, t: int) -> list[tuple[int, float]]:
    """The k entries ranked 1..k of one prompt position, as (token id, log-prob), descending."""
    ranked = sorted(
        (entry["rank"], int(token), entry["logprob"])
        for token, entry in (entries or {}).items()
        if entry["rank"] <= k
    )
    if len(ranked) < k:
        raise ServedTeacherError(
            f"the server returned {len(ranked)} of the top {k} log-probs at position {t} of row "
            f"{row}; start it with --max-logprobs >= {k}"
        )
    return [(token, logprob) for _, token, logprob in ranked[:k]]


def _last_position_top(choice: dict, k: int, row: int) -> list[tuple[int, float]]:
    """The top-k of the position after the prompt's last token, from the generated token's
    log-probs (keys "token_id:<id>")."""
    top = choice["logprobs"]["top_logprobs"][0]
    pairs = sorted(
        ((int(key.split(":", 1)[1]), value) for key, value in top.items()),
        key=lambda pair: -pair[1],
    )
    if len(pairs) < k:
        raise ServedTeacherError(
            f"the server returned {len(pairs)} of the top {k} log-probs after row {row}'s last "
            f"token; start it with --max-logprobs >= {k}"
        )
    return pairs[:k]


def _server_message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:500]
