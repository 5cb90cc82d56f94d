"""Run several training commands in one process, as examples/run_distillation_math.py would run
each (nemo_opd.cli.main), so that they share the imports and the Ray instance.

    python run_configs.py RUNS.json

RUNS.json: a list of {"args": [command-line arguments], "seed_checkpoint": [source, target] or
null}. seed_checkpoint copies a checkpoint directory of an earlier run (source) into this run's
checkpoint directory (target) before it starts, so that it resumes from there. Prints one line
"exit <i> <status>" per run.
"""

import json
import shutil
import sys
from pathlib import Path

from nemo_opd.cli import main

if __name__ == "__main__":
    runs = json.loads(Path(sys.argv[1]).read_text())
    for index, run in enumerate(runs):
        print(f"=== run {index}", flush=True)
        if run.get("seed_checkpoint"):
            source, target = run["seed_checkpoint"]
            shutil.copytree(source, target)
        status = main(run["args"])
        print(f"exit {index} {status}", flush=True)
