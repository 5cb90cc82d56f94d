"""Whether a Ray head answers at a cluster address (its form: nemo_opd.config.address).

    probe_head("10.0.0.1:6379", 10.0)  # returns once the head's GCS answered; SetupError if not

probe_head never blocks longer than its timeout. ray.init itself waits minutes before it gives
up on an address where nothing answers, or where something other than a GCS does; the probe
opens a TCP connection and sends the HTTP/2 connection preface (RFC 9113, section 3.4): the
GCS is a gRPC server, so it answers with a SETTINGS frame, and anything else (a dashboard, a
web server, a closed or filtered port) is reported at once.
"""

import socket

from nemo_opd.config.address import address_problem, split_address
from nemo_opd.errors import SetupError

_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, stream 0
_FRAME_HEADER = 9
_SETTINGS_TYPE = 4


def probe_head(address: str, timeout_s: float, source: str = "cluster.address") -> None:
    """Return once a Ray head's GCS answers at `address`; otherwise raise SetupError within
    about timeout_s, saying what answered (nothing, or something that is not a GCS) and what to
    check. `source` names where the address came from, for the message."""
    problem = address_problem(address)
    if problem:
        raise SetupError(f"{source}: {problem}")
    try:
        frame = _first_frame(split_address(address), timeout_s)
    except TimeoutError:
        raise SetupError(
            f"{source}: no Ray head answered at {address} within {timeout_s:g} s; "
            f"{_what_to_check(address)}"
        ) from None
    except OSError as error:
        raise SetupError(
            f"{source}: cannot reach a Ray head at {address} "
            f"({error.strerror or error}); {_what_to_check(address)}"
        ) from None
    if len(frame) < _FRAME_HEADER or frame[3] != _SETTINGS_TYPE:
        raise SetupError(
            f"{source}: something answers at {address}, but it is not a Ray head's GCS (no "
            "gRPC handshake); the address wanted is the one `ray start --head` prints for "
            "`ray start --address`, not the dashboard's or Ray Client's"
        )


def _first_frame(host_port: tuple[str, int], timeout_s: float) -> bytes:
    """The first bytes the server sends after an HTTP/2 client preface (at most one frame
    header); socket errors and TimeoutError propagate."""
    with socket.create_connection(host_port, timeout=timeout_s) as sock:
        sock.settimeout(timeout_s)
        sock.sendall(_H2_PREFACE + _EMPTY_SETTINGS)
        received = b""
        while len(received) < _FRAME_HEADER:
            chunk = sock.recv(_FRAME_HEADER - len(received))
            if not chunk:
                break
            received += chunk
        return received


def _what_to_check(address: str) -> str:
    return (
        f"check that the head node runs (`ray status --address={address}` on a node of the "
        "cluster), that the address and port are the ones `ray start --head` printed, and "
        "that no firewall blocks the port (docs/cluster.md, 'When a node is missing')"
    )
