"""The workers' own start-up output, kept in a log file when they run in the driver's process.

Under Ray each worker is a process whose output goes to its own log files. With the local
executor (one process) the same messages (vLLM's warnings about the platform, torch's C++
warnings, the models' weight-loading progress bars) would interleave with the run's own lines
on the user's console. While the workers start, the process's standard error (file
descriptor 2, so that C and C++ code writing to it is caught too) is appended to a log file;
the run's own lines go to standard output and stay on the console. vLLM logs to standard error
for this (generation/vllm_worker.py's quiet_vllm_logs sets VLLM_LOGGING_STREAM, unless the
user chose a stream).

    with start_up_output_to(Path(cfg.logger.log_dir) / WORKERS_LOG):
        ...start the workers...

When the start fails, the log's last lines are printed on the console's standard error before
the error goes on; when it succeeds, one line names the log if anything was written to it.

Worker processes started inside the block without Ray (the processes executor) are told the
log's path (WORKERS_LOG_ENV) and append their standard error to it for their whole life, as a
Ray worker writes to its own log files.
"""

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from nemo_opd.utils.text_width import wrapped

WORKERS_LOG = "workers.log"
"""In logger.log_dir: what the workers wrote to standard error while they started."""
WORKERS_LOG_ENV = "NEMO_OPD_WORKERS_LOG"
"""Set inside start_up_output_to's block: the log a worker process started there writes to."""
TAIL_LINES = 20
"""How many of the log's last lines a failed start shows."""


@contextmanager
def start_up_output_to(path: Path) -> Iterator[Path]:
    """Standard error appended to `path` inside the block (see the module docstring)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    console = os.dup(2)
    log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    size = os.fstat(log).st_size
    failed = True
    told = os.environ.get(WORKERS_LOG_ENV)
    os.environ[WORKERS_LOG_ENV] = str(path)
    try:
        os.dup2(log, 2)
        yield path
        failed = False
    finally:
        if told is None:
            os.environ.pop(WORKERS_LOG_ENV, None)
        else:
            os.environ[WORKERS_LOG_ENV] = told
        sys.stderr.flush()
        os.dup2(console, 2)
        os.close(console)
        os.close(log)
        if failed:
            _show_tail(path, size)
    if path.stat().st_size > size:
        print(wrapped(f"workers' start-up messages (engines, torch, the models): {path}"))


def _show_tail(path: Path, start: int) -> None:
    """The last TAIL_LINES lines written to `path` after byte `start`, on standard error."""
    with open(path, "rb") as handle:
        handle.seek(start)
        lines = handle.read().decode("utf-8", errors="replace").splitlines()
    if lines:
        shown = "\n".join(f"  {line}" for line in lines[-TAIL_LINES:])
        print(f"the workers' last start-up messages ({path}):\n{shown}", file=sys.stderr)
