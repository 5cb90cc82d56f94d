"""The address of a Ray cluster to attach to: its form, and whether a Ray head answers there.

    address_problem("10.0.0.1:6379")   # None: a host:port
    probe_head("10.0.0.1:6379", 10.0)  # returns once the head's GCS answered; SetupError if not

The address is the head node's GCS, host:port (`ray start --head --port=6379`; what Ray calls
the cluster address and what `ray start --address` takes). Two other addresses look alike and
are refused with a word on what they are: http://head:8265 is the dashboard, which `ray job
submit` talks to; ray://head:10001 is Ray Client, which this loop does not use (placement groups
and the object store traffic of refit want a driver inside the cluster).

probe_head never blocks longer than its timeout. ray.init itself waits minutes before it gives
up on an address where nothing answers, or where something other than a GCS does; the probe
opens a TCP connection and sends the HTTP/2 connection preface (RFC 9113, section 3.4): the
GCS is a gRPC server, so it answers with a SETTINGS frame, and anything else (a dashboard, a
web server, a closed or filtered port) is reported at once.
"""

import socket

from nemo_opd.errors import SetupError

DEFAULT_PORT = 6379
"""The GCS port `ray start --head` uses unless given --port."""
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_EMPTY_SETTINGS = bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])  # length 0, type SETTINGS, stream 0
_FRAME_HEADER = 9
_SETTINGS_TYPE = 4


def address_problem(address: str) -> str | None:
    """Why `address` is not a GCS address host:port (with what to give instead), or None."""
    if "://" in address:
        scheme = address.split("://", 1)[0].lower()
        if scheme in ("http", "https"):
            return (
                f"{address} is a dashboard address (what `ray job submit --address` takes); "
                f"give the head's GCS address host:port instead (port {DEFAULT_PORT} unless "
                "`ray start --head --port` said otherwise)"
            )
        if scheme == "ray":
            return (
                f"{address} is a Ray Client address, which this loop does not use; run the loop "
                "on a node of the cluster (or submit it with `ray job submit`) and give the "
                "head's GCS address host:port"
            )
        return f"{address} is not host:port"
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return f"{address} is not host:port (for example 10.0.0.1:{DEFAULT_PORT})"
    return None


def split_address(address: str) -> tuple[str, int]:
    """(host, port) of a valid address (see address_problem); IPv6 brackets removed."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


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
