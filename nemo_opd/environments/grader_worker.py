"""A grader worker process: grades one answer at a time for grader_pool.GraderPool.

    python -m nemo_opd.environments.grader_worker --grader math_verify --max-answer-chars 1000 \\
        --memory-mb 2048 --parent PID [--marked-only]

Protocol, one JSON line each way on stdin / stdout: it writes "ready" once it runs (its engine
installed), then reads {"response": str, "reference": str} and answers [correct, how]
(math_verify.grade). The engine is loaded on the first answer the fast path leaves to it, between
a "loading" and a "loaded" line (the pool gives the load its own time limit): a run whose answers
all take the fast path (the tiny task's) never loads math-verify and sympy. An engine that cannot
load, or grades a known right answer wrong, ends the worker with the reason on stderr (exit
status 3) instead of grading every such answer wrong. Anything else the libraries print goes to
stderr, so it cannot corrupt a reply.

Guards: its address space is capped at --memory-mb (a runaway sympy computation fails with
MemoryError, which counts as wrong, instead of swapping the machine); it dies with its parent
(Linux: PR_SET_PDEATHSIG), so a killed driver leaves no grader behind; it runs in a session of its
own, so a Ctrl-C in the driver's terminal reaches the driver only, which then shuts it down.
"""

import argparse
import json
import logging
import sys
from collections.abc import Callable

from nemo_opd.environments.math_verify import (
    GRADERS,
    EngineError,
    check_engine_installed,
    engine_grade,
    fast_grade,
    load_engine,
)
from nemo_opd.utils.worker_guards import die_with_parent, limit_memory, protocol_stream

EXIT_ENGINE = 3
"""The worker's exit status when its engine cannot load."""


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
    engine_or_exit(check_engine_installed, args.grader)
    out.write(b'"ready"\n')
    loaded = args.grader == "builtin"  # nothing to load
    for line in sys.stdin.buffer:
        request = json.loads(line)
        response, reference = request["response"], request["reference"]
        verdict = fast_grade(response, reference, args.max_answer_chars, args.marked_only)
        if verdict is None:
            if not loaded:
                out.write(b'"loading"\n')
                engine_or_exit(load_engine, args.grader)
                out.write(b'"loaded"\n')
                loaded = True
            verdict = engine_grade(
                response, reference, args.max_answer_chars, args.grader, args.marked_only
            )
        out.write(json.dumps(verdict).encode() + b"\n")


def engine_or_exit(check: Callable[[str], None], grader: str) -> None:
    """check(grader) (check_engine_installed or load_engine), or exit with status EXIT_ENGINE and
    its reason on stderr."""
    try:
        check(grader)
    except EngineError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        sys.exit(EXIT_ENGINE)


if __name__ == "__main__":
    main()
