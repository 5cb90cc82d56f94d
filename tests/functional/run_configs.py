"""Run several training commands in one process, as examples/run_distillation_math.py would run
each (nemo_opd.cli.main), so that they share the imports and the fork server.

    python run_configs.py RUNS.json

RUNS.json: a list of {"args": [command-line arguments], "seed_checkpoint": [source, target] or
null}. seed_checkpoint copies a checkpoint directory of an earlier run (source) into this run's
checkpoint directory (target) before it starts, so that it resumes from there. Prints one line
"=== run <i>" before and "exit <i> <status>" after each run.

run_here(runs) runs the same list in the calling process (a test's: runs of the local executor,
which start no process, then share the test process's imports too) and returns each run's
output as the script prints it.
"""

import contextlib
import io
import json
import shutil
import sys
from pathlib import Path

from nemo_opd.cli import main


def run_here(runs: list[dict]) -> list[str]:
    """Each run of `runs` in this process, one after the other: its standard output, from the
    line after "=== run <i>" to "exit <i> <status>" (what the script prints between markers)."""
    outputs = []
    for index, run in enumerate(runs):
        _seed(run)
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            status = main(run["args"])
        outputs.append(f"{index}\n{printed.getvalue()}exit {index} {status}\n")
    return outputs


def _seed(run: dict) -> None:
    if run.get("seed_checkpoint"):
        source, target = run["seed_checkpoint"]
        shutil.copytree(source, target)


if __name__ == "__main__":
    runs = json.loads(Path(sys.argv[1]).read_text())
    for index, run in enumerate(runs):
        print(f"=== run {index}", flush=True)
        _seed(run)
        status = main(run["args"])
        print(f"exit {index} {status}", flush=True)
