"""The cluster address: its form, and a probe that tells a Ray head from anything else within
its timeout (real servers on loopback: a Ray head, a web server, a silent one, none)."""

import http.server
import socket
import threading
import time

import pytest
import ray

from nemo_opd.config.address import address_problem, split_address
from nemo_opd.distributed.address import probe_head
from nemo_opd.errors import SetupError

pytestmark = pytest.mark.usefixtures("own_ray")  # a Ray head of its own to probe


def test_forms():
    assert address_problem("10.0.0.1:6379") is None
    assert address_problem("[::1]:6379") is None
    assert split_address("[::1]:6379") == ("::1", 6379)
    assert "dashboard" in address_problem("https://head:8265")
    assert "Ray Client" in address_problem("ray://head:10001")
    for bad in ("head", "head:", "head:x", ":1", "head:0", "head:65536", "tcp://head:1"):
        assert "is not host:port" in address_problem(bad), bad


@pytest.fixture
def listening():
    """A loopback socket that accepts connections and never says a word."""
    server = socket.create_server(("127.0.0.1", 0))
    yield f"127.0.0.1:{server.getsockname()[1]}"
    server.close()


@pytest.fixture
def web_server():
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{sock.getsockname()[1]}"  # closed again when the block ends


def test_nothing_listening_is_reported_at_once():
    address = closed_port()
    started = time.monotonic()
    with pytest.raises(SetupError, match=rf"cluster.address: cannot reach a Ray head at {address}"):
        probe_head(address, timeout_s=5.0)
    assert time.monotonic() - started < 2.0


def test_a_silent_server_is_reported_after_the_timeout(listening):
    started = time.monotonic()
    with pytest.raises(SetupError, match=r"RAY_ADDRESS: no Ray head answered at .* within 0.5 s"):
        probe_head(listening, timeout_s=0.5, source="RAY_ADDRESS")
    assert time.monotonic() - started < 3.0


def test_a_web_server_is_not_a_ray_head(web_server):
    with pytest.raises(SetupError, match="something answers at .* but it is not a Ray head's GCS"):
        probe_head(web_server, timeout_s=5.0)


def test_a_ray_head_answers():
    context = ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        probe_head(context.address_info["gcs_address"], timeout_s=5.0)
    finally:
        ray.shutdown()
