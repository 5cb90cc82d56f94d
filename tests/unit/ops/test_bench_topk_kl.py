"""The top-k KL benchmark: its CPU smoke mode runs end to end, and its NeMo-RL re-implementation
computes what our tail="renormalize" computes (so the two are timed on the same math)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from topk_kl_testing import make_case

from nemo_opd.losses import TopkKLParams, topk_kl

BENCHMARKS = Path(__file__).resolve().parents[3] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

import bench_topk_kl  # noqa: E402


def test_quick_cpu_run_writes_results(tmp_path):
    out = tmp_path / "results.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    bench = BENCHMARKS / "bench_topk_kl.py"
    cmd = [sys.executable, str(bench), "--device", "cpu", "--quick", "--json", str(out)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "nemo_rl_reimpl" in result.stdout and "triton" in result.stdout
    rows = json.loads(out.read_text())["results"]
    assert all(row["error"] is None and row["total_ms"] > 0 for row in rows)
    runs = {(row["name"], row["case"]["path"], row["case"]["tail"]) for row in rows}
    ours = {
        (impl, path, tail)
        for impl in ("triton", "torch")
        for path in ("training", "per_token")
        for tail in ("bucket", "renormalize")
    }
    nemo_rl = {("nemo_rl_reimpl", path, "renormalize") for path in ("training", "per_token")}
    assert runs == ours | nemo_rl
    assert len(rows) == 2 * len(runs)  # two values of N in the quick mode


@pytest.mark.parametrize("kl_type", bench_topk_kl.NEMO_RL_KL_TYPES)
def test_nemo_rl_reimpl_is_our_renormalize_mode(kl_type):
    logits, logprobs, ids = make_case(6, 211, 9, seed=30)
    params = TopkKLParams(kl_type=kl_type, mixed_kl_weight=0.3, tail="renormalize", temperature=0.7)
    grads = []
    for forward in (
        lambda z: bench_topk_kl.nemo_rl_reimpl(z, logprobs, ids, params),
        lambda z: topk_kl(z, logprobs, ids, params=params, implementation="torch"),
    ):
        z = logits.clone().requires_grad_()
        div = forward(z)
        (div * torch.linspace(-1.0, 2.0, 6)).sum().backward()
        grads.append((div.detach(), z.grad))
    torch.testing.assert_close(grads[0][0], grads[1][0], atol=2e-6, rtol=1e-5)
    torch.testing.assert_close(grads[0][1], grads[1][1], atol=2e-6, rtol=1e-5)


def test_nemo_rl_reimpl_is_left_out_where_nemo_rl_has_no_such_divergence():
    args = bench_topk_kl.parse_args(["--device", "cpu", "--quick", "--kl-type", "jsd"])
    assert "nemo_rl_reimpl" not in bench_topk_kl.runnable_impls(args, torch.device("cpu"))
    logits, logprobs, ids = make_case(2, 11, 3)
    with pytest.raises(ValueError, match="kl_type"):
        bench_topk_kl.nemo_rl_reimpl(logits, logprobs, ids, TopkKLParams(kl_type="jsd"))
