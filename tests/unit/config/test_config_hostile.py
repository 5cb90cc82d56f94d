"""Hostile configs, overrides and template files through the real command line: each is refused
(exit 2) within 5 CPU-seconds (and 20 s of wall time) and 500 MB, with one `error:` message and
no traceback, and no secret in stdout, stderr or the log directory. Each case ran past a minute,
ate gigabytes, ended in a traceback or printed a secret before the bounds existed.

Every case runs `nemo_opd.cli.main` in a process of its own (its arguments passed in a file: a
single command-line argument is capped at 128 KiB by Linux, and some cases are longer), which
is timed and which reads its own CPU time and peak resident memory from the kernel. The hostile
cases' processes are forked, one per case, from a process that imported the command line once
for the module (FORKS): each case's process is as fresh as a new interpreter's after that
import, without paying for it again; the user-info case runs the command line in a new
interpreter (run_cli), as a user does. The time bound is on CPU seconds, which a loaded machine
does not stretch; the wall-time bound catches what waits without computing.
"""

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

TINY = str(Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml")
# The child's own peak: VmHWM of its address space (ru_maxrss would include the parent's
# peak, which Linux carries across fork and exec).
CHILD = """
import json, os, sys
from nemo_opd.cli import main
status = 1
try:
    status = main(json.load(open(sys.argv[1], encoding="utf-8")))
finally:
    with open("/proc/self/status") as status_file, open(sys.argv[2], "w") as peak:
        line = next(row for row in status_file if row.startswith("VmHWM:"))
        times = os.times()
        peak.write(f"{line.split()[1]} {times.user + times.system}")  # kB, CPU seconds
sys.exit(status)
"""
# Reads one case a line on stdin ({"argv", "peak", "stdout", "stderr", "cwd", "env"}), runs
# main on it in a forked process that ends as the child above would (a traceback on stderr and
# status 1 for an exception; a parser's SystemExit as its status) and answers its exit status.
FORKS = """
import json, os, sys, traceback
from nemo_opd.cli import main
for line in sys.stdin:
    case = json.loads(line)
    pid = os.fork()
    if pid == 0:
        status = 1
        try:
            os.chdir(case["cwd"])
            os.environ.update(case["env"])
            for fd, path in ((1, case["stdout"]), (2, case["stderr"])):
                os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            try:
                status = main(json.load(open(case["argv"], encoding="utf-8")))
            except SystemExit as stop:
                status = stop.code if isinstance(stop.code, int) else 1
                if stop.code is not None and not isinstance(stop.code, int):
                    print(stop.code, file=sys.stderr)
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            with open("/proc/self/status") as status_file, open(case["peak"], "w") as peak:
                line = next(row for row in status_file if row.startswith("VmHWM:"))
                times = os.times()  # a forked child's start at zero
                peak.write(f"{line.split()[1]} {times.user + times.system}")  # kB, CPU s
        finally:
            os._exit(status)
    _, waited = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(waited), flush=True)
"""
CPU_BOUND_S = 5.0
"""The work a refusal may take: its process's CPU seconds (on an idle machine its wall time),
which the machine's load does not stretch."""
WALL_BOUND_S = 20.0
"""A refusal's wall time, for what spends no CPU (a wait on the network, a sleep): 4x the
CPU bound, the slack a loaded 2-core machine needs."""
CASE_TIMEOUT_S = 60.0
"""Far past the bounds: a case that hangs fails here."""
SECRET = "hunter2-pw"
BIG = "${mul:" + ",".join(["99999999999"] * 500) + "}"  # 5,500 digits


def nested_add(depth: int) -> str:
    text = "1"
    for _ in range(depth):
        text = "${add:" + text + ",1}"
    return text


def select_chain(resolver: str, levels: int) -> list[str]:
    """++b.x<i> refers to b.x<i-1> twice through `resolver`: 2**levels evaluations."""
    first = ["++b.x0=a"]
    return first + [
        f"++b.x{i}='${{{resolver}:b.x{i - 1}}}${{{resolver}:b.x{i - 1}}}'"
        for i in range(1, levels + 1)
    ]


def named_chain(levels: int) -> list[str]:
    """++b.x<i> refers twice to the key ++b.n<i> names, b.x<i-1>: 2**levels characters, and
    2**levels evaluations where each reference is resolved again."""
    first = ["++b.x0=ab"]
    return first + [
        f"++b.n{i}=b.x{i - 1}" if half == 0 else f"++b.x{i}='${{${{b.n{i}}}}}${{${{b.n{i}}}}}'"
        for i in range(1, levels + 1)
        for half in range(2)
    ]


def resolver_alias_bomb(levels: int) -> str:
    """A flow mapping of YAML anchors, each ten uses of the previous one: 10**levels values for
    a resolver that parses YAML (oc.create)."""
    anchors = ["a0: &a0 [" + ", ".join(["x"] * 10) + "]"]
    anchors += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "{" + ", ".join(anchors) + "}"


def run_cli(tmp_path: Path, argv: list[str], env: dict | None = None) -> dict:
    """Run the command line on argv in a fresh process: exit status, seconds, peak MiB (as the
    process measured itself), output."""
    args, peak = tmp_path / "argv.json", tmp_path / "peak_kib"
    args.write_text(json.dumps(["--config", *argv]), encoding="utf-8")
    start = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(args), str(peak)],
        cwd=tmp_path,
        capture_output=True,
        env={**os.environ, **(env or {})},
        timeout=CASE_TIMEOUT_S,  # a hang fails here
    )
    return {
        "status": result.returncode,
        "seconds": time.monotonic() - start,
        **own_figures(peak),
        "out": result.stdout.decode("utf-8", "replace"),
        "err": result.stderr.decode("utf-8", "replace"),
    }


def own_figures(path: Path) -> dict:
    """What a case's process wrote of itself: its peak MiB and its CPU seconds."""
    kib, cpu = path.read_text().split()
    return {"peak_mib": int(kib) / 1024, "cpu_seconds": float(cpu)}


class Forks:
    """The module's process that forks a process per case (FORKS)."""

    def __init__(self) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", FORKS],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its cases' processes in its group: one kill ends all
        )

    def run(self, tmp_path: Path, argv: list[str], env: dict | None = None) -> dict:
        """run_cli's answer for argv, from a process forked for it."""
        args, peak = tmp_path / "argv.json", tmp_path / "peak_kib"
        out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        args.write_text(json.dumps(["--config", *argv]), encoding="utf-8")
        case = {"argv": str(args), "peak": str(peak), "stdout": str(out), "stderr": str(err)}
        case.update(cwd=str(tmp_path), env=env or {})
        start = time.monotonic()
        self.process.stdin.write(json.dumps(case) + "\n")
        self.process.stdin.flush()
        answered = select.select([self.process.stdout], [], [], CASE_TIMEOUT_S)[0]
        line = self.process.stdout.readline() if answered else ""
        seconds = time.monotonic() - start
        if not line:
            self.close()
            pytest.fail(f"no exit status within {CASE_TIMEOUT_S:.0f} s (the forks' process ended?)")
        texts = [path.read_bytes().decode("utf-8", "replace") for path in (out, err)]
        for path in (out, err):
            path.unlink()
        return {
            "status": int(line),
            "seconds": seconds,
            **own_figures(peak),
            "out": texts[0],
            "err": texts[1],
        }

    def close(self) -> None:
        """Let it end (its stdin closed), or end it and its cases' processes."""
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process.stdout.close()


@pytest.fixture(scope="module")
def forks():
    forks = Forks()
    yield forks
    forks.close()


CASES = {
    # 1. a resolver OmegaConf re-evaluates at every level (16 levels of doubling: past 60 s)
    "oc.select doubling": [TINY, *select_chain("oc.select", 16), "--print-config"],
    # 2. results and nesting that made tracebacks
    "a 5,500-digit product": [TINY, f"distillation.seed='{BIG}'", "--print-config"],
    "a 5,500-digit stop token": [TINY, f"policy.generation.stop_token_ids=['{BIG}']"],
    "200 nested add": [TINY, f"distillation.seed='{nested_add(200)}'", "--print-config"],
    # 3. an environment variable copied into the printed config
    "oc.env": [TINY, "++logger.wandb.name='${oc.env:NEMO_OPD_TEST_SECRET}'", "--print-config"],
    "oc.env named by a key": [
        TINY,
        "logger.wandb.project=oc.env",
        "logger.wandb.name='${${logger.wandb.project}:NEMO_OPD_TEST_SECRET}'",
        "--print-config",
    ],
    "oc.env named in part by a key": [
        TINY,
        "logger.wandb.project=env",
        "logger.wandb.name='${oc.${logger.wandb.project}:NEMO_OPD_TEST_SECRET}'",
        "--print-config",
    ],
    "oc.env after an escaped backslash": [
        TINY,
        "logger.wandb.name='\\\\${oc.env:NEMO_OPD_TEST_SECRET}'",
        "--print-config",
    ],
    # keys that refer to keys named by interpolations, doubling (24 levels: past a minute)
    "named keys doubling": [TINY, *named_chain(24), "--print-config"],
    # 4. templates that failed at the first step, or built a gigabyte per row
    "a conversion": [TINY, "teacher.prompt_template='{prompt!z}'", "--print-config"],
    "a format spec": [TINY, "teacher.prompt_template='{prompt:d}'", "--print-config"],
    "a nested spec": [TINY, "teacher.prompt_template='{prompt:{answer}}'", "--print-config"],
    "a gigabyte width": [TINY, "teacher.prompt_template='{prompt:>1000000000}'", "--print-config"],
    # 5. numbers that reach the clock and the network, and URLs that are not http(s)
    "timeout 1e308": [TINY, "teacher.server.timeout_s=1e308", "--print-config"],
    "back-off 1e300": [TINY, "teacher.server.retry_backoff_s=1e300", "--print-config"],
    "a file URL": [TINY, "teacher.server.base_url=file:///etc/passwd", "--print-config"],
    "no scheme": [TINY, "teacher.server.base_url=host:8000/v1", "--print-config"],
    "user-info, no scheme": [
        TINY,
        f"teacher.server.base_url=alice:{SECRET}@host/v1",
        "--print-config",
    ],
    "user-info, a space": [
        TINY,
        f"teacher.server.base_url='http://alice:{SECRET} x@host/v1'",
        "--print-config",
    ],
    "user-info, a port that is not one": [
        TINY,
        f"teacher.server.base_url='http://alice:{SECRET}?@host/v1'",
        "--print-config",
    ],
    # 6. scale
    "400,000 key parts": [TINY, "++" + ".".join(["a"] * 400_000) + "=1", "--print-config"],
    "a 1 MB key": [TINY, "++" + "k" * 1_000_000 + "=1", "--print-config"],
}
PROMPT_FILES = {
    "an attribute": "{0.foo} {{}}",
    "a trillion-wide field": "{0:>1000000000000}{{}}",
    "only escaped braces": "Answer the question {{}} now.",
}


def assert_refused(result: dict) -> str:
    """Exit 2 within the bounds with one error message; returns the message."""
    assert result["status"] == 2, result["err"][-2000:]
    assert result["cpu_seconds"] < CPU_BOUND_S, f"{result['cpu_seconds']:.1f} CPU-s"
    assert result["seconds"] < WALL_BOUND_S, f"{result['seconds']:.1f} s"
    assert result["peak_mib"] < 500, f"{result['peak_mib']:.0f} MiB"
    err = result["err"]
    assert err.startswith("error: ") and err.count("error: ") == 1, err[-2000:]
    assert "Traceback" not in err and result["out"] == ""
    assert len(err) < 10_000  # the message names the problems; it does not echo the input
    return err


@pytest.mark.parametrize("name", list(CASES))
def test_each_hostile_case_is_refused_in_bounds(forks, tmp_path, name):
    env = {"NEMO_OPD_TEST_SECRET": SECRET}
    message = assert_refused(forks.run(tmp_path, CASES[name], env))
    assert SECRET not in message


@pytest.mark.parametrize("name", list(PROMPT_FILES))
def test_each_hostile_prompt_file_is_refused_in_bounds(forks, tmp_path, name):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text(PROMPT_FILES[name], encoding="utf-8")
    message = assert_refused(forks.run(tmp_path, [TINY, f"data.prompt_file={prompt}"]))
    assert message.startswith("error: data.prompt_file: the template ")


def test_an_alias_bomb_for_a_resolver_named_by_a_key(forks, tmp_path):
    # oc.create parsed it: each level took 10x the last (7 levels, 466 bytes: minutes)
    bomb = tmp_path / "bomb.yaml"
    name = f"${{${{.project}}:'{resolver_alias_bomb(7)}'}}"
    bomb.write_text(
        f'defaults: {TINY}\nlogger:\n  wandb:\n    project: oc.create\n    name: "{name}"\n'
    )
    message = assert_refused(forks.run(tmp_path, [str(bomb), "--print-config"]))
    assert "the resolver 'oc.create' is not available" in message


def test_ten_thousand_teachers_or_unknown_keys(forks, tmp_path):
    teachers = tmp_path / "teachers.yaml"
    entries = ", ".join(f"t{i}: {{model_name: m}}" for i in range(10_000))
    teachers.write_text(f"defaults: {TINY}\nteacher: null\nteachers: {{{entries}}}\n")
    message = assert_refused(forks.run(tmp_path, [str(teachers), "--print-config"]))
    assert "10,000 teachers, more than the 64" in message
    unknown = tmp_path / "unknown.yaml"
    keys = "".join(f"  k{i}: 1\n" for i in range(10_000))
    unknown.write_text(f"defaults: {TINY}\npolicy:\n{keys}")
    message = assert_refused(forks.run(tmp_path, [str(unknown), "--print-config"]))
    assert "(10,000 problems)" in message and message.rstrip().endswith("... and 9,980 more")


@pytest.mark.parametrize("password", [SECRET, f"p@{SECRET}"])  # httpx sends p@... whole
def test_user_info_in_a_url_is_never_printed(tmp_path, password):
    url = f"http://user:{password}@127.0.0.1:9/v1"
    served = ["teacher.server.enabled=true", f"teacher.server.base_url={url}"]
    printed = run_cli(tmp_path, [TINY, *served, "--print-config"])
    assert printed["status"] == 0 and printed["err"] == ""
    assert SECRET not in printed["out"] and "base_url: http://***@127.0.0.1:9/v1" in printed["out"]
    # a bad value of the key is echoed redacted too
    refused = run_cli(tmp_path, [TINY, *served, "teacher.server.timeout_s=-1", "--print-config"])
    assert refused["status"] == 2 and SECRET not in refused["err"] + refused["out"]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.name != "argv.json"]
    assert not any(SECRET in p.read_text(errors="replace") for p in written)
