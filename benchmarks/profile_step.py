"""Where a steady-state step's time goes, per process: nemo_opd's default beside TRL's trainers.

    uv run --extra cpu --group bench python benchmarks/profile_step.py --out runs/profile_step

Runs each system's command as benchmarks/bench_vs_trl.py does (same config, same settings) and,
once it is training in steady state (nemo_opd: its 10th step logged; TRL: its first logged
loss), samples for --seconds:

- every process of the command's process tree (psutil): the CPU time each used, as cores busy
  (1.0 = one core all the time; the rest of the window it waited);
- each Python process's stacks with py-spy (running threads only, so the samples are its busy
  time), each sample classified by its frames: serializing (pickle, cloudpickle, Ray's
  serialization), transferring (Ray's object store and task calls), or computing (the rest),
  and by activity (the worker method or trainer phase it is in).

Writes OUT/profile.json and OUT/profile.md (the tables) and prints them. Start-up is not
profiled here: nemo_opd prints and logs its own per-process start-up marks, TRL's imports are
in bench_vs_trl's results.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

import bench_vs_trl  # noqa: E402
from harness import loop_command, run_meta  # noqa: E402

SERIALIZING = ("serialization.py", "cloudpickle", "pickle")
TRANSFERRING = ("put_object", "get_objects", "ray.get", "_raylet", "submit_task", "_remote (")
"""Frame substrings (py-spy's "function (file:line)") that mark a sample's class; the first
class any frame of the stack matches wins, in the order serializing, transferring."""

ACTIVITIES = (
    ("heldout_accuracy", "validation"),
    ("validate", "validation"),
    ("PolicyWorker.evaluate", "validation"),
    ("PolicyWorker.train", "train"),
    ("PolicyWorker.get_topk_logits", "teacher top-k"),
    ("PolicyWorker.get_logprobs", "log-probs (refit check)"),
    ("_put_answer", "refit: gather and put weights"),  # the Ray worker group's put
    ("PolicyWorker.full_weights", "refit: gather weights"),
    ("VllmWorker.update_weights", "refit: load weights"),
    ("VllmWorker.generate", "generate"),
    ("PolicyWorker.save", "checkpoint"),
    ("produce_step", "rollouts: requests, grading, batching"),
    ("_train_step", "train step: metrics, logging"),
    ("generate", "generate"),
    ("compute_loss", "loss: student and teacher forward"),
    ("backward", "backward"),
    ("Optimizer.step", "optimizer"),
    ("_single_tensor_adam", "optimizer"),
    ("grade", "grading"),
)
"""(frame substring, activity): a sample's activity is that of the outermost frame (from the
root) that matches one, else "other"."""


def process_role(proc: psutil.Process, root: int) -> str:
    """A readable name for a process of the tree."""
    if proc.pid == root:
        return "driver"
    try:
        title = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for marker in ("ray::VllmWorker", "ray::PolicyWorker", "ray::MathEnvironment"):
        if title.startswith(marker):
            return marker.removeprefix("ray::")
    if "grader" in title:
        return "grader"
    if "ray" in title or "gcs_server" in title or "raylet" in title:
        return "ray (its own services)"
    return Path(title.split()[0]).name if title else "other"


def classify(stack: list[str]) -> tuple[str, str]:
    """(class, activity) of one py-spy sample, its frames from the root."""
    joined = ";".join(stack)
    kind = "computing"
    if any(marker in joined for marker in SERIALIZING):
        kind = "serializing"
    elif any(marker in joined for marker in TRANSFERRING):
        kind = "transferring"
    for frame in stack:
        for marker, activity in ACTIVITIES:
            if (
                frame.startswith(marker)
                or f".{marker} (" in frame
                or frame.startswith(f"{marker} (")
            ):
                return kind, activity
    return kind, "other"


def read_raw(path: Path) -> list[tuple[list[str], int]]:
    """py-spy's raw (collapsed) output: (frames from the root, samples)."""
    if not path.exists():
        return []
    samples = []
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if stack:
            frames = stack.split(";")
            if frames and frames[0].startswith("process "):
                frames = frames[1:]  # py-spy's --subprocesses label; not used here
            samples.append((frames, int(count)))
    return samples


def profile_tree(root: int, seconds: float, rate: int, out: Path, pyspy: str) -> list[dict]:
    """Sample every process under `root` for `seconds` (module docstring); one record each."""
    procs = {p.pid: p for p in [psutil.Process(root), *psutil.Process(root).children(True)]}
    roles = {pid: process_role(p, root) for pid, p in procs.items()}
    before = {}
    for pid, proc in procs.items():
        with contextlib.suppress(psutil.Error):
            before[pid] = sum(proc.cpu_times()[:2])
    spies = {}
    for pid, role in roles.items():
        if role in ("driver", "VllmWorker", "PolicyWorker", "MathEnvironment", "grader"):
            raw = out / f"spy_{pid}.txt"
            command = [
                pyspy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", str(rate),
                "--nonblocking", "-f", "raw", "-o", str(raw),
            ]  # fmt: skip
            quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
            spies[pid] = (subprocess.Popen(command, **quiet), raw)
    started = time.time()
    time.sleep(seconds)
    wall = time.time() - started
    records = []
    for pid, proc in procs.items():
        try:
            used = sum(proc.cpu_times()[:2]) - before[pid]
        except (psutil.Error, KeyError):
            continue
        records.append({"pid": pid, "role": roles[pid], "cores_busy": used / wall})
    for pid, (spy, raw) in spies.items():
        try:
            spy.wait(timeout=seconds + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
        kinds, activities = Counter(), Counter()
        for frames, count in read_raw(raw):
            kind, activity = classify(frames)
            kinds[kind] += count
            activities[activity] += count
        record = next(r for r in records if r["pid"] == pid)
        total = sum(kinds.values()) or 1
        record["samples"] = sum(kinds.values())
        record["kinds"] = {kind: n / total for kind, n in kinds.most_common()}
        record["activities"] = {name: n / total for name, n in activities.most_common()}
    for record in records:
        if record["role"] == "PolicyWorker" and "activities" in record:
            # the student trains, the teacher only scores
            record["role"] = (
                "PolicyWorker (student)"
                if "train" in record["activities"]
                else ("PolicyWorker (teacher)")
            )
    return sorted(records, key=lambda r: -r["cores_busy"])


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise SystemExit(f"profile_step: {what} did not happen within {timeout:.0f} s")
        time.sleep(0.2)


def profile_system(system: str, args: argparse.Namespace, out: Path) -> dict:
    """Start `system`'s command, profile its steady state, let it finish; its record."""
    work = out / system
    shutil.rmtree(work, ignore_errors=True)  # an earlier run's metrics would read as steady
    work.mkdir(parents=True)
    settings = bench_vs_trl.matched_settings(args.config, args.overrides)
    (work / "settings.json").write_text(json.dumps(settings))
    log = work / "run.log"
    if system == "nemo_opd":
        command = loop_command(args.config, work, args.overrides)
        metrics = work / "logs" / "metrics.jsonl"

        def steady() -> bool:
            return metrics.exists() and metrics.read_text().count("\n") >= 11

    else:
        trainer = system.removeprefix("trl_")
        command = [
            sys.executable, str(REPO / "benchmarks" / "bench_vs_trl.py"), "trl",
            f"--trainer={trainer}", "--settings", str(work / "settings.json"), "--out", str(work),
        ]  # fmt: skip

        def steady() -> bool:
            return log.exists() and "'loss'" in log.read_text()

    print(f"{system}: {' '.join(command)}", flush=True)
    with open(log, "w") as handle:
        proc = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, cwd=REPO)
        try:
            wait_for(lambda: steady() or proc.poll() is not None, 600, f"{system}'s steady state")
            if proc.poll() is not None:
                raise SystemExit(f"{system} ended before its steady state; see {log}")
            records = profile_tree(proc.pid, args.seconds, args.rate, work, args.pyspy)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
    return {"processes": records, "window_s": args.seconds}


def report(results: dict, out: Path) -> str:
    lines = []
    for system, data in results["systems"].items():
        lines += [
            f"{bench_vs_trl.SYSTEMS[system]} ({data['window_s']:.0f} s of steady state):",
            "",
            "| process | cores busy | of its busy time: computing / serializing / "
            "transferring | activities (share of its busy samples) |",
            "|---|---|---|---|",
        ]
        total = 0.0
        for record in data["processes"]:
            total += record["cores_busy"]
            if record["cores_busy"] < 0.005 and "kinds" not in record:
                continue
            kinds = record.get("kinds", {})
            split = " / ".join(
                f"{kinds.get(k, 0):.0%}" for k in ("computing", "serializing", "transferring")
            )
            top = ", ".join(
                f"{name} {share:.0%}"
                for name, share in list(record.get("activities", {}).items())[:5]
                if share >= 0.02
            )
            shown = split if kinds else "-"
            lines.append(f"| {record['role']} | {record['cores_busy']:.2f} | {shown} | {top} |")
        lines += ["", f"all processes together: {total:.2f} cores busy", ""]
    text = "\n".join(lines)
    (out / "profile.md").write_text(text + "\n")
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="examples/configs/distillation_tiny.yaml")
    parser.add_argument("--out", default="runs/profile_step")
    parser.add_argument("--systems", nargs="+", default=list(bench_vs_trl.SYSTEMS))
    parser.add_argument("--seconds", type=float, default=12.0, help="sampling window")
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--pyspy", default=str(Path(sys.executable).parent / "py-spy"))
    parser.add_argument("overrides", nargs="*", help="overrides of the config, for every system")
    args = parser.parse_args()
    if not Path(args.pyspy).exists():
        raise SystemExit(
            f"profile_step needs py-spy ({args.pyspy} not found): uv sync --extra cpu --group bench"
        )
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = {"meta": run_meta(), "config": args.config, "overrides": args.overrides}
    results["systems"] = {system: profile_system(system, args, out) for system in args.systems}
    (out / "profile.json").write_text(json.dumps(results, indent=2))
    print(report(results, out))


if __name__ == "__main__":
    main()
