"""The shared benchmark harness: forward / backward / total time, peak memory, table, JSON.

A benchmark describes each candidate as three callables:

    make_inputs() -> inputs          fresh inputs for one iteration (not timed)
    forward(inputs) -> outputs       timed as "forward"
    backward(inputs, outputs)        timed as "backward"

On CUDA the times are CUDA-event medians over `iters` iterations after `warmup` untimed ones,
and the peak memory is torch.cuda.max_memory_allocated() during one forward + backward minus
what was allocated before it (the inputs), so it is the memory the candidate itself needs. On
CPU the times come from time.perf_counter() and no memory is reported.
"""

import contextlib
import datetime
import json
import platform
import shutil
import statistics
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil
import torch


@dataclass
class Measurement:
    """One candidate on one case."""

    name: str
    case: dict[str, Any]
    forward_ms: float | None = None
    backward_ms: float | None = None
    total_ms: float | None = None
    peak_memory_mb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time_once(forward, backward, inputs, device) -> tuple[float, float]:
    if device.type == "cuda":
        start, mid, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        start.record()
        outputs = forward(inputs)
        mid.record()
        backward(inputs, outputs)
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(mid), mid.elapsed_time(end)
    t0 = time.perf_counter()
    outputs = forward(inputs)
    t1 = time.perf_counter()
    backward(inputs, outputs)
    t2 = time.perf_counter()
    return (t1 - t0) * 1e3, (t2 - t1) * 1e3


def _peak_memory_mb(forward, backward, make_inputs, device) -> float | None:
    if device.type != "cuda":
        return None
    torch.cuda.empty_cache()
    inputs = make_inputs()
    _sync(device)
    torch.cuda.reset_peak_memory_stats(device)
    base = torch.cuda.memory_allocated(device)
    backward(inputs, forward(inputs))
    _sync(device)
    return (torch.cuda.max_memory_allocated(device) - base) / 2**20


def measure(
    name: str,
    case: dict[str, Any],
    make_inputs: Callable[[], Any],
    forward: Callable[[Any], Any],
    backward: Callable[[Any, Any], None],
    *,
    device: torch.device,
    warmup: int = 3,
    iters: int = 10,
) -> Measurement:
    """Time and measure one candidate on one case; an out-of-memory error is recorded, not
    raised."""
    result = Measurement(name, dict(case))
    try:
        for _ in range(warmup):
            backward(inputs := make_inputs(), forward(inputs))
            del inputs
        _sync(device)
        fwd, bwd = [], []
        for _ in range(iters):
            inputs = make_inputs()
            _sync(device)
            f, b = _time_once(forward, backward, inputs, device)
            fwd.append(f)
            bwd.append(b)
            del inputs
        result.forward_ms = statistics.median(fwd)
        result.backward_ms = statistics.median(bwd)
        result.total_ms = statistics.median(f + b for f, b in zip(fwd, bwd, strict=True))
        result.peak_memory_mb = _peak_memory_mb(forward, backward, make_inputs, device)
    except torch.OutOfMemoryError:
        result.error = "out of memory"
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def format_table(rows: Sequence[Measurement], extra_columns: Sequence[str] = ()) -> str:
    """A plain-text table, one line per measurement."""
    case_keys = list(dict.fromkeys(key for row in rows for key in row.case))
    header = [*case_keys, "impl", "fwd ms", "bwd ms", "total ms", "peak MiB", *extra_columns]

    def cell(value: Any) -> str:
        if value is None:
            return "-"
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = [header]
    for row in rows:
        values = [row.case.get(key) for key in case_keys]
        timings = [row.forward_ms, row.backward_ms, row.total_ms, row.peak_memory_mb]
        if row.error:
            timings = [row.error, None, None, None]
        lines.append([cell(v) for v in (*values, row.name, *timings)])
        lines[-1] += [cell(row.extra.get(column)) for column in extra_columns]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.rjust(w) for c, w in zip(line, widths, strict=True)) for line in lines
    )


def write_json(path: str, rows: Sequence[Measurement], meta: dict[str, Any]) -> None:
    """Results with the environment they were measured in."""
    meta = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        **meta,
    }
    with open(path, "w") as f:
        json.dump({"meta": meta, "results": [asdict(row) for row in rows]}, f, indent=2)


def run_meta() -> dict[str, Any]:
    """Where and when a benchmark ran: date (UTC), processor, cores, Python and torch versions."""
    import os

    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "processor": device_name(torch.device("cpu")),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }


def loop_records(log_dir) -> list[dict[str, Any]]:
    """The metrics a run of the loop logged (logger.log_dir/metrics.jsonl), one dict per
    logged step, in order; SystemExit when there are none."""
    from pathlib import Path

    path = Path(log_dir) / "metrics.jsonl"
    if not path.is_file():
        raise SystemExit(f"no metrics.jsonl in {log_dir}: the run logged nothing")
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_results(out, results: dict[str, Any], table: str) -> None:
    """OUT/results.json and OUT/results.md (the table, also printed)."""
    from pathlib import Path

    (Path(out) / "results.json").write_text(json.dumps(results, indent=2))
    (Path(out) / "results.md").write_text(table + "\n")
    print(table)


def pyplot():
    """matplotlib's pyplot on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(figure, path):
    """Write `figure` as a PNG at `path` (tight layout), close it; returns the path."""
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    pyplot().close(figure)
    return path


def loop_command(config: str, run_dir: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The README's command for `config` with `overrides`, its checkpoints and logs under
    `run_dir` (set last, so they win)."""
    script = Path(__file__).resolve().parent.parent / "examples" / "run_distillation_math.py"
    return [
        sys.executable, str(script), "--config", str(config), *overrides,
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
    ]  # fmt: skip


RUN_FOLDERS = ("checkpoints", "logs")
"""What loop_command puts under a run's folder."""


def fresh_run_dir(run_dir: Path) -> Path:
    """`run_dir` with the checkpoints and logs of an earlier run of the same benchmark removed
    (nothing else in it is touched), so that a benchmark run again with the same --out measures
    a new run: otherwise the loop resumes the old one, says there is nothing to do, or refuses
    to write a new final model over the old one (nemo_opd.utils.run_identity)."""
    run_dir = Path(run_dir)
    removed = [run_dir / name for name in RUN_FOLDERS if (run_dir / name).exists()]
    for folder in removed:
        shutil.rmtree(folder)
    if removed:
        print(f"{run_dir}: an earlier run's checkpoints and logs removed", flush=True)
    run_dir.mkdir(parents=True, exist_ok=True)
    return run_dir


POLL_S = 0.1
"""How often PeakMemory polls (s)."""
PSS_EVERY = 20
"""PeakMemory reads the proportional sets every this many polls (2 s): reading one walks the
process's page tables, and every 0.1 s on an 18 GiB process that slowed it by ~45%."""


class PeakMemory:
    """Polls a process and all its descendants every POLL_S seconds: each one's peak resident
    set (VmHWM, the peak since it started, so no peak of a process alive when polled is
    missed), named by its Ray class where it is an actor; and the largest sum of their current
    resident sets seen at one poll (`peak_total`), and of their proportional sets (`peak_pss`,
    every PSS_EVERY polls: pages shared between processes, such as Ray's object store,
    counted once in all). With `cap_bytes`, the whole tree is killed once the resident sum
    passes it (`capped` is then True): a run that does not fit ends as one."""

    def __init__(self, root: int, cap_bytes: int | None = None) -> None:
        self.root = psutil.Process(root)
        self.cap_bytes = cap_bytes
        self.peak: dict[int, int] = {}
        self.titles: dict[int, set[str]] = {}
        self.peak_total = 0
        self.peak_pss = 0
        self.capped = False
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def stop(self) -> dict[str, int]:
        """Stop polling; the peak bytes of each named process."""
        self._stop.set()
        self._thread.join()
        out: dict[str, int] = {}
        for pid, peak in self.peak.items():
            name = self._name(pid)
            if name in out:  # several processes of one kind: number them
                name = f"{name} #{sum(k.startswith(name) for k in out) + 1}"
            out[name] = peak
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def _poll(self) -> None:
        polls = 0
        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                processes = []
            total = sum(self._read(process) for process in processes)
            self.peak_total = max(self.peak_total, total)
            polls += 1
            if polls % PSS_EVERY == 1:  # a page-table walk: costly for a large process
                self.peak_pss = max(self.peak_pss, sum(map(_pss, processes)))
            if self.cap_bytes is not None and total > self.cap_bytes and not self.capped:
                self.capped = True
                for process in reversed(processes):
                    with contextlib.suppress(psutil.Error):
                        process.kill()
            self._stop.wait(POLL_S)

    def _read(self, process: psutil.Process) -> int:
        """Record the process's peak and title; its current resident bytes (0 if gone)."""
        try:
            with open(f"/proc/{process.pid}/status") as status:
                fields = dict(line.split(":", 1) for line in status if ":" in line)
            hwm, rss = (int(fields[key].split()[0]) * 1024 for key in ("VmHWM", "VmRSS"))
            title = " ".join(process.cmdline())
        except (OSError, KeyError, ValueError, psutil.Error):
            return 0
        self.peak[process.pid] = max(self.peak.get(process.pid, 0), hwm)
        self.titles.setdefault(process.pid, set()).add(title)
        return rss

    def _name(self, pid: int) -> str:
        titles = self.titles[pid]
        if pid == self.root.pid:
            return "driver"
        actors = {
            t.split()[0][len("ray::") :].split(".")[0] for t in titles if t.startswith("ray::")
        }
        actors.discard("IDLE")
        if not actors:
            words = next((t.split() for t in sorted(titles) if t.strip()), ["?"])
            program = Path(words[0]).name
            return "grader worker" if any("grader_worker" in t for t in titles) else program
        actor = sorted(actors)[0]
        if actor == "PolicyWorker":
            if any(".train" in t for t in titles):
                return "student (PolicyWorker)"
            if any("get_topk_logits" in t for t in titles):
                return "teacher (PolicyWorker)"
        return actor


def _pss(process: psutil.Process) -> int:
    """The process's proportional set size in bytes (0 if gone or unreadable)."""
    try:
        with open(f"/proc/{process.pid}/smaps_rollup") as rollup:
            return next(int(r.split()[1]) for r in rollup if r.startswith("Pss:")) * 1024
    except (OSError, StopIteration, ValueError):
        return 0
