"""The GPU lane's plumbing on a CPU: its script runs every step in dry-run mode (tiny shapes,
Triton's interpreter), its reports, and the wheel bundle it carries (built from pyproject's
pins, small enough to travel, installable offline into a fresh Python 3.12)."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_engine  # noqa: E402
import gpu_lane_report  # noqa: E402
import gpu_wheels  # noqa: E402

STEPS = (
    "env",
    "a_kernel",
    "b_topk",
    "c_scale",
    "d_engine",
    "e_mcore",
    "f_full",
    "g_loop",
    "h_shapes",
    "i_liger",
    "j_prefix",
)


def run_lane(out: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, OUT=str(out), PYTHON=sys.executable)
    command = ["bash", str(BENCHMARKS / "gpu_lane.sh"), "--dry-run", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)


def step_rows(summary: str) -> dict[str, str]:
    rows = {}
    for line in summary.splitlines():
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        if len(cells) == 4 and cells[0] in STEPS:
            rows[cells[0]] = cells[1]
    return rows


@pytest.mark.slow  # every step of the lane on a CPU: `pytest -m slow`
def test_dry_run_passes_every_step_and_keeps_each_result(tmp_path):
    done = run_lane(tmp_path, "--all")
    summary = (tmp_path / "summary.md").read_text()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert step_rows(summary) == dict.fromkeys(STEPS, "pass")
    with tarfile.open(tmp_path / "lane.tgz") as archive:
        names = set(archive.getnames())
    for step in STEPS:
        assert f"logs/{step}.log" in names
    results = ["kernel.xml", "topk_kl.json", "scale.json", "engine.json", "parity_cpu.json"]
    results += ["parity_dtensor.json", "parity_megatron.json", "full_vocab_h64.json"]
    results += ["loop_tiny.json", "loop_tiny_metrics.jsonl", "loop_shapes.json", "liger.json"]
    results += ["prefix.json"]
    assert {f"results/{name}" for name in results} <= names
    assert "test_matches_brute_force" in summary  # the kernel's pass/fail table
    assert "triton bv=128" in summary and "triton inplace" in summary  # the block sweep
    assert "dtensor/cpu vs megatron/cpu" in summary  # the parity table


def test_a_step_that_fails_is_reported_and_the_rest_still_run(tmp_path):
    # A megatron package that cannot be imported: the env step fails (it imports every
    # engine); the kernel step, which needs no megatron, still runs and passes.
    broken = tmp_path / "broken" / "megatron"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('megatron is broken here')\n")
    env = dict(os.environ, OUT=str(tmp_path), PYTHON=sys.executable)
    env["PYTHONPATH"] = str(broken.parent)
    command = ["bash", str(BENCHMARKS / "gpu_lane.sh"), "--dry-run", "env", "a_kernel"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    summary = (tmp_path / "summary.md").read_text()
    assert done.returncode == 1, done.stdout[-3000:]
    assert step_rows(summary) == {"env": "FAIL", "a_kernel": "pass"}
    assert "megatron is broken here" in summary


def test_junit_table_counts_cases_per_test_and_names_failures(tmp_path):
    xml = tmp_path / "r.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="m" name="test_a[x]" time="0.5"/>'
        '<testcase classname="m" name="test_a[y]" time="0.25">'
        '<failure message="AssertionError: too far">trace</failure></testcase>'
        '<testcase classname="m" name="test_b" time="0.1"><skipped message="no GPU"/></testcase>'
        "</testsuite></testsuites>"
    )
    table = gpu_lane_report.junit_table(xml)
    lines = table.splitlines()
    assert lines[1].split() == ["test_a", "1", "1", "0", "0", "0.8"]
    assert lines[2].split() == ["test_b", "0", "0", "0", "1", "0.1"]
    assert lines[3].split() == ["all", "1", "1", "0", "1"]
    assert lines[4] == "FAILED: test_a[y: AssertionError: too far"


def test_parity_compare_fails_on_a_difference(tmp_path, capsys):
    record = {
        "backend": "dtensor", "device": "cpu", "loss": [0.5, 0.4], "grad_norm": [1.0, 0.9],
        "teacher_topk_logprobs": [[-0.1, -2.0]], "teacher_topk_indices": [[3, 7]],
    }  # fmt: skip
    same, off = tmp_path / "a.json", tmp_path / "b.json"
    same.write_text(json.dumps(record))
    off.write_text(json.dumps({**record, "device": "cuda", "loss": [0.5, 0.41]}))
    assert bench_engine.compare([same, same]) == 0
    assert bench_engine.compare([same, off]) == 1
    assert "loss" in capsys.readouterr().out


def test_wheel_requirements_are_pyprojects_pins_for_python_312():
    pins = {req.name: str(req.specifier) for req in gpu_wheels.lane_requirements()}
    assert set(pins) == set(gpu_wheels.LANE_PACKAGES)
    assert pins["hydra-core"] == "==1.3.8"
    assert set(pins["megatron-core"].split(",")) == {">=0.17", "<0.20"}  # Python 3.12's pin


def test_wheel_bundle_fits_and_installs_offline_into_a_fresh_python_312(tmp_path):
    try:
        gpu_wheels.find_python()
    except SystemExit:
        pytest.skip("no Python 3.12 interpreter on this machine")
    wheels = gpu_wheels.build_bundle(tmp_path / "whl")
    names = {gpu_wheels.wheel_name(w) for w in wheels}
    assert {"pydantic", "pydantic-core", "omegaconf", "hydra-core", "megatron-core"} <= names
    assert {"math-verify", "latex2sympy2-extended"} <= names  # the loop steps' grader
    assert "antlr4-python3-runtime" in names  # built here from its source archive
    assert not names & gpu_wheels.DEVICE_PACKAGES
    assert sum(w.stat().st_size for w in wheels) < gpu_wheels.BUNDLE_LIMIT_MIB * 2**20
    gpu_wheels.check_install(tmp_path / "whl")
