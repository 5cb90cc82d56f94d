"""A Ray cluster of several nodes on this machine, started and stopped by a test.

    with LocalCluster(tmp_dir, num_nodes=2, cpus_per_node=2) as cluster:
        cluster.address          # "127.0.0.2:PORT", the head's GCS
        cluster.node_addresses   # ["127.0.0.2", "127.0.0.3"]

Each node is a `ray start --block` process, as on a real cluster, with its own loopback
address (127.0.0.2, 127.0.0.3, ...: Ray replaces 127.0.0.1 by the machine's interface address,
any other 127.x address is kept), its own CPUs, a Ray temp directory of the cluster's own (so
that `ray.init()` elsewhere on the machine never finds it), and:
- the test process's environment, which holds the authentication settings every node and
  driver must share (RAY_AUTH_MODE and RAY_AUTH_TOKEN: tests/conftest.py sets them);
- GLOO_SOCKET_IFNAME=lo: torch.distributed's gloo transport on loopback (it otherwise uses
  the address the host name resolves to).

private_dir: a directory that the nodes after the head do not see: they run in a mount
namespace of their own (`unshare --mount`) where an empty tmpfs covers it, as a node-local
disk would. Where mount namespaces are not allowed, `private_dir_hidden` is False.

Stopping sends SIGTERM to each `ray start --block`, which stops that node's processes.
"""

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

START_TIMEOUT_S = 90.0
STARTED = "Ray runtime started"


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def mount_namespaces_work() -> bool:
    """Whether this process may start a program in a mount namespace of its own."""
    try:
        done = subprocess.run(
            [*_unshare_prefix(), "true"], capture_output=True, timeout=30, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _unshare_prefix() -> list[str]:
    user = [] if os.geteuid() == 0 else ["--map-root-user"]
    return ["unshare", "--mount", *user, "--propagation", "private"]


class LocalCluster:
    """num_nodes Ray nodes on 127.0.0.2, 127.0.0.3, ... (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        num_nodes: int = 2,
        cpus_per_node: int = 2,
        private_dir: Path | None = None,
    ) -> None:
        self.root = Path(root)
        self.num_nodes = num_nodes
        self.cpus_per_node = cpus_per_node
        self.private_dir = private_dir
        self.private_dir_hidden = private_dir is not None and mount_namespaces_work()
        self.node_addresses = [f"127.0.0.{2 + index}" for index in range(num_nodes)]
        self.port = free_port(self.node_addresses[0])
        self.address = f"{self.node_addresses[0]}:{self.port}"
        self.processes: list[subprocess.Popen] = []

    def __enter__(self) -> "LocalCluster":
        try:
            for index in range(self.num_nodes):
                self._start_node(index)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_node(self, index: int) -> None:
        """Start node `index` (0: the head) and wait until it says it runs."""
        log = self.root / f"node{index}.log"
        command = self._command(index)
        if index > 0 and self.private_dir_hidden:
            self.private_dir.mkdir(parents=True, exist_ok=True)
            hide = f'mount -t tmpfs tmpfs {shlex.quote(str(self.private_dir))} && exec "$@"'
            command = [*_unshare_prefix(), "sh", "-c", hide, "sh", *command]
        with open(log, "w") as out:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=self._env(), cwd=self.root
            )
        self.processes.append(process)
        deadline = time.monotonic() + START_TIMEOUT_S
        while STARTED not in log.read_text():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Ray node {index} did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.2)

    def _command(self, index: int) -> list[str]:
        ray_start = [sys.executable, "-m", "ray.scripts.scripts", "start", "--block"]
        node = [
            f"--node-ip-address={self.node_addresses[index]}",
            f"--num-cpus={self.cpus_per_node}",
            "--num-gpus=0",
            f"--temp-dir={self.root / 'ray'}",
            "--disable-usage-stats",
        ]
        if index == 0:
            return [*ray_start, "--head", f"--port={self.port}", "--include-dashboard=false", *node]
        return [*ray_start, f"--address={self.address}", *node]

    def _env(self) -> dict[str, str]:
        env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
        env.update(GLOO_SOCKET_IFNAME="lo", RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")
        return env

    def alive(self) -> bool:
        """Whether every node's `ray start --block` still runs."""
        return bool(self.processes) and all(p.poll() is None for p in self.processes)

    def stop(self) -> None:
        """SIGTERM each node (the head last), waiting for each to end."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes = []
