"""The address of a Ray cluster to attach to, and its form (checked when the config loads).

The address is the head node's GCS, host:port (`ray start --head --port=6379`; what Ray calls
the cluster address and what `ray start --address` takes). Two other addresses look alike and
are refused with a word on what they are: http://head:8265 is the dashboard, which `ray job
submit` talks to; ray://head:10001 is Ray Client, which this loop does not use (placement groups
and the object store traffic of refit want a driver inside the cluster). Whether a head answers
there is nemo_opd.distributed.address.probe_head's question.
"""

from nemo_opd.config.schema import DistillationConfig

DEFAULT_PORT = 6379
"""The GCS port `ray start --head` uses unless given --port."""


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


def check_cluster_address(cfg: DistillationConfig) -> list[str]:
    """cluster.address, when set, is a Ray head's GCS address host:port (or "auto"), not a
    dashboard (http://) or Ray Client (ray://) address."""
    address = cfg.cluster.address
    problem = address_problem(address) if address not in (None, "auto") else None
    return [f"cluster.address: {problem}"] if problem else []
