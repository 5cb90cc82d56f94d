"""Tables for the GPU lane's summary (benchmarks/gpu_lane.sh).

    python benchmarks/gpu_lane_report.py env
    python benchmarks/gpu_lane_report.py junit RESULTS.xml

env: the Python, the device and the versions the lane depends on, then the imports of every
later step (nemo_opd's config, losses, both engines, the loop and the transformers generation
engine); exit status 1 when one fails.
junit: pytest's JUnit XML as a pass/fail table, one line per test function (its parametrized
cases counted together), then every case that did not pass with the first line of its message.
"""

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from pathlib import Path

OUTCOMES = ("passed", "failed", "error", "skipped")


def junit_cases(path: Path) -> list[tuple[str, str, str, float]]:
    """(test function, case id, outcome, seconds) of every test case in the XML."""
    cases = []
    for case in ET.parse(path).getroot().iter("testcase"):
        name = case.get("name", "?")
        function, _, params = name.partition("[")
        outcome, message = "passed", ""
        for tag in ("failure", "error", "skipped"):
            found = case.find(tag)
            if found is not None:
                outcome = "failed" if tag == "failure" else tag
                message = (found.get("message") or found.text or "").strip().splitlines()
                message = message[0][:160] if message else ""
                break
        case_id = params.rstrip("]") + (f": {message}" if message else "")
        cases.append((function, case_id, outcome, float(case.get("time", 0.0))))
    return cases


def junit_table(path: Path) -> str:
    cases = junit_cases(path)
    by_function: dict[str, Counter] = defaultdict(Counter)
    seconds: dict[str, float] = defaultdict(float)
    for function, _, outcome, took in cases:
        by_function[function][outcome] += 1
        seconds[function] += took
    width = max([len(f) for f in by_function] + [4])
    lines = [f"{'test':{width}}  " + "  ".join(f"{o:>7}" for o in OUTCOMES) + "  seconds"]
    for function, counts in by_function.items():
        cells = "  ".join(f"{counts[o]:>7}" for o in OUTCOMES)
        lines.append(f"{function:{width}}  {cells}  {seconds[function]:7.1f}")
    totals = Counter(outcome for *_, outcome, _ in cases)
    lines.append(f"{'all':{width}}  " + "  ".join(f"{totals[o]:>7}" for o in OUTCOMES))
    for function, case_id, outcome, _ in cases:
        if outcome in ("failed", "error"):
            lines.append(f"{outcome.upper()}: {function}[{case_id}")
    return "\n".join(lines)


LANE_MODULES = (
    "torch",
    "triton",
    "transformers",
    "peft",
    "pydantic",
    "omegaconf",
    "hydra",
    "megatron.core",
    "math_verify",
    "pytest",
)
NEMO_OPD_MODULES = (
    "nemo_opd.config",
    "nemo_opd.losses",
    "nemo_opd.policy.engines.dtensor",
    "nemo_opd.policy.engines.megatron",
    "nemo_opd.algorithms.distillation",
    "nemo_opd.generation.hf_worker",
)


def report_env() -> int:
    import importlib
    import platform

    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    print(
        f"python {platform.python_version()}, torch {torch.__version__} (CUDA "
        f"{torch.version.cuda}), device {device}"
    )
    failed = []
    for name in (*LANE_MODULES, *NEMO_OPD_MODULES):
        try:
            module = importlib.import_module(name)
        except Exception as error:  # every failure is reported, then the status says so
            failed.append(name)
            print(f"{name:34} FAILED: {type(error).__name__}: {error}")
            continue
        print(f"{name:34} {getattr(module, '__version__', 'ok')}")
    return 1 if failed else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="mode", required=True)
    sub.add_parser("env")
    junit = sub.add_parser("junit")
    junit.add_argument("xml", type=Path)
    args = parser.parse_args(argv)
    if args.mode == "env":
        return report_env()
    if not args.xml.is_file():
        print(f"no JUnit XML at {args.xml}: pytest did not get as far as writing it")
        return 1
    print(junit_table(args.xml))
    return 0


if __name__ == "__main__":
    sys.exit(main())
