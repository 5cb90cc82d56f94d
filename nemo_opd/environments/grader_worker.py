"""A grader worker process: grades one answer at a time for grader_pool.GraderPool.

    python -m nemo_opd.environments.grader_worker --grader math_verify --max-answer-chars 1000 \\
        --memory-mb 2048 --parent PID [--marked-only]

Protocol, one JSON line each way on stdin / stdout: it writes "ready" once its engine is loaded,
then reads {"response": str, "reference": str} and answers [correct, how] (math_verify.grade).
Anything else the libraries print goes to stderr, so it cannot corrupt a reply.

Guards: its address space is capped at --memory-mb (a runaway sympy computation fails with
MemoryError, which counts as wrong, instead of swapping the machine); it dies with its parent
(Linux: PR_SET_PDEATHSIG), so a killed driver leaves no grader behind; it runs in a session of its
own, so a Ctrl-C in the driver's terminal reaches the driver only, which then shuts it down.
"""

import argparse
import json
import logging
import sys

from nemo_opd.environments.math_verify import GRADERS, grade, warm_up
from nemo_opd.utils.worker_guards import die_with_parent, limit_memory, protocol_stream


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--grader", choices=GRADERS, required=True)
    parser.add_argument("--max-answer-chars", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--marked-only", action="store_true")
    args = parser.parse_args(argv)
    die_with_parent(args.parent)
    limit_memory(args.memory_mb)
    logging.getLogger("math_verify").setLevel(logging.CRITICAL)  # parse failures are routine
    out = protocol_stream()
    warm_up(args.grader)
    out.write(b'"ready"\n')
    for line in sys.stdin.buffer:
        request = json.loads(line)
        response, reference = request["response"], request["reference"]
        verdict = grade(response, reference, args.max_answer_chars, args.grader, args.marked_only)
        out.write(json.dumps(verdict).encode() + b"\n")


if __name__ == "__main__":
    main()
