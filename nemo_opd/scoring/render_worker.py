"""A render worker process: renders, scores and maps a teacher's rows for render_pool.RenderPool.

    python -m nemo_opd.scoring.render_worker --rendering PATH --teacher PATH --parent PID \\
        [--threads N]

At start it reads the pickled TeacherRendering and teacher at those paths, then writes "ready".
Then, one JSON line each way on stdin / stdout, it reads {"request": path} and answers
{"metrics": {...}} (the teacher's take_metrics() since the last job) or {"error": ...} (below).
The request file holds a pickled dict: "batch" (the student's rows of this job: input_ids and
token_mask [b, S]), "logs" (their conversations), "need" (TeacherNeed), "first" (the job's
first row in the whole batch) and "outputs" ({name: (path, dtype, shape)}: files of the whole
batch's answers, [B, ...]). The worker runs score_rendered on its rows, with the teacher's
score() on the rendered ones, and writes rows first..first + b of each answer into its file:
the answers never cross the pipe, and the pool reads them without a copy.

An exception in a job is answered, not raised: {"error": path, "message": str, "traceback":
str}, the exception itself pickled at path when it can be (the pool raises it again, so a
served teacher's ServedTeacherError reaches the loop as itself), null otherwise. The worker
then goes on with the next job.

Guards: it dies with its parent (Linux: PR_SET_PDEATHSIG), runs in a session of its own (a
Ctrl-C reaches the driver only, which then stops it), and writes replies on a private stream
(nemo_opd.utils.worker_guards), so what the libraries print cannot corrupt them.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import sys
import tempfile
import traceback

import numpy as np
import torch

from nemo_opd.data.batching import TensorBatch
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.scoring.rendering import TeacherRendering, score_rendered
from nemo_opd.utils.worker_guards import die_with_parent, protocol_stream


def run_job(rendering: TeacherRendering, teacher, request: dict) -> None:
    """Score one job's rows and write them into the pool's output files (module docstring)."""
    need: TeacherNeed = request["need"]

    def score_rows(rows):
        return teacher.score(Rollouts(rows.batch, rows.logs, []), need)

    batch = TensorBatch(request["batch"])
    answer = score_rendered(rendering, batch, request["logs"], need, score_rows)
    outputs = request["outputs"]
    if answer.keys() != outputs.keys():
        raise RuntimeError(
            f"the job asked for {sorted(outputs)}; the teacher gave {sorted(answer)}"
        )
    first = request["first"]
    for name, (path, dtype, shape) in outputs.items():
        values = answer[name].numpy()
        if values.dtype != np.dtype(dtype):  # a cast would change the answers' bits
            raise RuntimeError(f"{name}: the teacher gave {values.dtype}, the pool reads {dtype}")
        table = np.memmap(path, dtype=values.dtype, mode="r+", shape=tuple(shape))
        table[first : first + len(values)] = values
        del table  # unmapped; the pool's own mapping reads the same pages


def _error_reply(error: BaseException, folder: str) -> dict:
    """The reply for a job that raised: the exception pickled into a file of `folder` when it
    pickles, its message and traceback in any case."""
    path = None
    try:
        data = pickle.dumps(error, protocol=5)
        pickle.loads(data)  # an exception that pickles but cannot be rebuilt is sent as text
    except Exception:
        data = None
    if data is not None:
        handle, path = tempfile.mkstemp(prefix="error-", suffix=".pkl", dir=folder)
        with os.fdopen(handle, "wb") as file:
            file.write(data)
    return {
        "error": path,
        "message": f"{type(error).__name__}: {error}",
        "traceback": "".join(traceback.format_exception(error)),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rendering", required=True, help="the pickled TeacherRendering")
    parser.add_argument("--teacher", required=True, help="the pickled teacher")
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    out = protocol_stream()
    torch.set_num_threads(args.threads)
    with open(args.rendering, "rb") as file:
        rendering = pickle.load(file)
    with open(args.teacher, "rb") as file:
        teacher = pickle.load(file)
    out.write(b'"ready"\n')
    for line in sys.stdin.buffer:
        path = json.loads(line)["request"]
        try:
            with open(path, "rb") as file:
                request = pickle.load(file)
            run_job(rendering, teacher, request)
            reply = {"metrics": teacher.take_metrics()}
        except Exception as error:  # answered: the pool raises it in the driver
            reply = _error_reply(error, os.path.dirname(path))
        out.write(json.dumps(reply).encode() + b"\n")


if __name__ == "__main__":
    main()
