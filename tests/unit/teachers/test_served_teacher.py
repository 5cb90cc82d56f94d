"""ServedTeacher without a live server: retries, malformed replies, the API key, splitting
between render workers and the longest wait, against local stand-ins. Against the real vLLM
server (the tiny teacher in fp32, started by `python -m nemo_opd.teacher_server`), its scores
are checked in tests/functional/test_served_teacher_loop.py, whose server is up for the loop's
runs anyway."""

import http.server
import socket
import threading

import pytest
from served_rows import ragged_batch

from nemo_opd.errors import ServiceError
from nemo_opd.teachers.served import ServedTeacher, ServedTeacherError

K = 16


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
