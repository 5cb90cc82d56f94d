"""Run several training commands in one process, as examples/run_distillation_math.py would run
each (nemo_opd.cli.main), so that they share the imports and the Ray instance.

    python run_configs.py RUNS.json

RUNS.json: a list of {"args": [command-line arguments], "stop_after_checkpoint": N or null}.
With stop_after_checkpoint, a watcher sends this process SIGTERM once the run's checkpoint of
step N exists (the loop then finishes its step, saves and returns 143). Prints one line
"exit <i> <status>" per run.
"""

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

from nemo_opd.cli import main


def stop_when_saved(checkpoint_dir: Path, step: int) -> threading.Thread:
    marker = checkpoint_dir / f"step_{step}" / "training_state.json"

    def watch() -> None:
        while not marker.exists():
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


if __name__ == "__main__":
    runs = json.loads(Path(sys.argv[1]).read_text())
    for index, run in enumerate(runs):
        print(f"=== run {index}", flush=True)
        if run.get("stop_after_checkpoint"):
            stop_when_saved(Path(run["checkpoint_dir"]), run["stop_after_checkpoint"])
        status = main(run["args"])
        print(f"exit {index} {status}", flush=True)
