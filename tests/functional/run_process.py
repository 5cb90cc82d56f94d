"""A run of the loop as its own process, as the fault tests start, stop and kill it."""

import json
import subprocess
import time
from pathlib import Path

import psutil
from run_metrics import read_metrics


def run_to_end(command: list[str], run_dir: Path) -> subprocess.CompletedProcess:
    """Run `command` in run_dir to its end; a non-zero exit fails the test with its output."""
    result = subprocess.run(command, cwd=run_dir, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result


class Run:
    """A run started in the background (its own session), its output in run_dir/out.txt and
    run_dir/err.txt; its checkpoints under run_dir/checkpoints."""

    def __init__(self, command: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.out, self.err = run_dir / "out.txt", run_dir / "err.txt"
        with open(self.out, "w") as out, open(self.err, "w") as err:
            self.process = subprocess.Popen(
                command, cwd=run_dir, stdout=out, stderr=err, start_new_session=True
            )

    def wait_for_checkpoint(self, step: int) -> None:
        marker = self.run_dir / "checkpoints" / f"step_{step}" / "training_state.json"
        deadline = time.monotonic() + 900
        while not marker.exists():
            assert self.process.poll() is None, f"the run ended first:\n{self.err.read_text()}"
            assert time.monotonic() < deadline, f"checkpoint {step} never appeared"
            time.sleep(0.1)

    def wait_for_step(self, step: int) -> None:
        """Until the run has logged `step`'s metrics (logs/metrics.jsonl; a line still being
        written reads as nothing logged yet)."""
        deadline = time.monotonic() + 900
        while step not in _metrics_so_far(self.run_dir):
            assert self.process.poll() is None, f"the run ended first:\n{self.err.read_text()}"
            assert time.monotonic() < deadline, f"step {step} was never logged"
            time.sleep(0.1)

    def policy_workers(self) -> list[int]:
        """Pids of this run's training workers (student and teacher PolicyWorkers)."""
        return actor_pids(psutil.Process(self.process.pid), "PolicyWorker")

    def generation_workers(self) -> list[int]:
        """Pids of this run's vLLM engines (VllmWorkers)."""
        return actor_pids(psutil.Process(self.process.pid), "VllmWorker")

    def finish(self, timeout: float = 600) -> tuple[int, str, str]:
        """Exit status, stdout and stderr; a run that does not end in time fails the test."""
        code = self.process.wait(timeout=timeout)
        return code, self.out.read_text(), self.err.read_text()


def _metrics_so_far(run_dir: Path) -> dict[int, dict]:
    """read_metrics(run_dir), or {} while its last line is being written."""
    try:
        return read_metrics(run_dir)
    except json.JSONDecodeError:
        return {}


def actor_pids(root: psutil.Process, actor_class: str) -> list[int]:
    """Pids of the `actor_class` workers below `root`: Ray names each actor's process after its
    class (ray::<class> in its command line), the processes executor names its ranks' processes
    after theirs (the process's name, its first 15 characters)."""
    found = []
    for child in root.children(recursive=True):
        try:
            named = child.name() == actor_class[:15]
            if named or f"ray::{actor_class}" in " ".join(child.cmdline()):
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found
