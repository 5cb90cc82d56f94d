"""The top-k KL benchmark's CPU smoke mode runs end to end and writes its JSON."""

import json
import os
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_topk_kl.py"


def test_quick_cpu_run_writes_results(tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    cmd = [sys.executable, str(BENCH), "--device", "cpu", "--quick", "--json", str(out)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "nemo_rl" in result.stdout and "triton" in result.stdout
    rows = json.loads(out.read_text())["results"]
    assert {row["name"] for row in rows} == {"triton", "torch", "nemo_rl"}
    assert all(row["error"] is None and row["total_ms"] > 0 for row in rows)
