"""bench_vs_liger at a tiny shape on the CPU (the lane's dry run): the systems that run here are
measured and checked against float64, the ones that cannot (Liger's Triton kernel) are recorded
as such, and the check's verdict follows the issue's rule (faster than Liger's chunked loss, no
more memory than its fused one, at every shape)."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_vs_liger  # noqa: E402

pytest.importorskip("liger_kernel")


def test_a_dry_run_measures_what_runs_here_and_checks_the_gradients(tmp_path):
    out = tmp_path / "liger.json"
    argv = ["--device", "cpu", "--tokens", "64", "--hidden", "32", "--vocab", "1024"]
    argv += ["--grad-tokens", "32", "--warmup", "0", "--repeats", "1", "--json", str(out)]
    assert bench_vs_liger.main(argv) == 0
    record = json.loads(out.read_text())
    speed = {row["name"]: row for row in record["speed"]}
    assert set(speed) == set(bench_vs_liger.SYSTEMS)
    for name in ("nemo_opd", "liger_chunked"):
        assert speed[name]["total_ms"] > 0 and not speed[name]["error"]
    for name in ("liger_fused", "liger_fused_fp32_accum"):  # Triton: CUDA only
        assert "CUDA only" in speed[name]["error"]
    grads = {row["name"]: row for row in record["gradients"]}
    # bf16 inputs and gradients: the loss within bf16's rounding of the logits, the gradients
    # within a few of its ulps (2^-8), against float64 on the same values.
    assert grads["nemo_opd"]["loss"] < 1e-3
    assert grads["nemo_opd"]["student_input"] < 3e-2
    assert grads["nemo_opd"]["student_weight"] < 3e-2
    assert "liger_chunked" in grads and "loss" in grads["liger_chunked"]
    assert record["check"] == "not measured"  # no fused kernel and no memory on a CPU


def _row(shape, name, ms, mb):
    return {"shape": shape, "name": name, "total_ms": ms, "peak_memory_mb": mb, "error": None}


@pytest.mark.parametrize(
    "ours, verdict",
    [
        ((9.0, 100.0), "met"),
        ((11.0, 100.0), "not met (liger: slower)"),
        ((9.0, 300.0), "not met (liger: more memory)"),
    ],
)
def test_the_check_needs_both_at_every_shape(ours, verdict):
    rows = [
        _row("liger", "nemo_opd", *ours),
        _row("liger", "liger_chunked", 10.0, 500.0),
        _row("liger", "liger_fused", 20.0, 200.0),
    ]
    assert bench_vs_liger.check({"speed": rows}) == verdict
    rows.append(_row("qwen3", "nemo_opd", 9.0, 100.0))  # a shape without the peers
    assert bench_vs_liger.check({"speed": rows}) == "not measured"
