"""bench_scale end to end at a small size: every implementation runs in its own process, the
JSON holds one record per run, and the chunked paths' measured peak is a fraction of the whole
logits' (what the benchmark exists to show, so a chunked path that materialises [N, V] fails
here). No address-space cap: the largest run needs ~2.3 GiB, and a cap on address space also
counts the allocator arenas and thread stacks a many-core machine reserves. TRL, the peer, is in
the bench dependency group only: its run is checked where it is installed."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
VOCAB, TOKENS = 32000, 2048
LOGITS_BYTES = TOKENS * VOCAB * 4


def _bench(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess:
    out = tmp_path / "scale.json"
    command = [
        sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), f"--vocab={VOCAB}",
        "--hidden=64", "--tokens", str(TOKENS), "--k=16", "--repeats=1", "--threads=1",
        "--memory-gb=0", f"--json={out}", *flags,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)


def _runs(tmp_path: Path, done: subprocess.CompletedProcess) -> dict:
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "scale.json").read_text())
    assert report["meta"]["vocab"] == VOCAB
    runs = {(r["impl"], r["path"], r.get("chunk")): r for r in report["results"]}
    failed = [r for r in runs.values() if r["seconds"] is None or "error" in r]
    assert not failed, failed
    return runs


@pytest.mark.slow  # the benchmark's own runs: `pytest -m slow`
def test_chunked_peak_is_a_fraction_of_the_whole_logits(tmp_path):
    flags = ("--chunk", "64", "256", "--impls", "chunked", "unchunked")
    runs = _runs(tmp_path, _bench(tmp_path, *flags))
    assert len(runs) == 6  # chunked at 2 sizes + unchunked, for both paths
    for path in ("student", "teacher"):
        whole = runs["unchunked", path, None]["peak_bytes"]
        assert whole >= LOGITS_BYTES  # the [N, V] logits at least
        # A chunk's working set is a few [C, V] buffers: at C = N / 32 under a quarter of the
        # whole logits' peak (one [N, V] fp32 tensor alone, LOGITS_BYTES, is ~45% of it), at
        # C = N / 8 under half (allocator slack makes its exact peak vary between runs).
        small, large = (runs["chunked", path, c]["peak_bytes"] for c in (64, 256))
        assert small < whole / 4 and large < whole / 2, (path, small, large, whole)


@pytest.mark.skipif(importlib.util.find_spec("trl") is None, reason="TRL: uv sync --group bench")
def test_trl_holds_both_whole_logits(tmp_path):
    runs = _runs(tmp_path, _bench(tmp_path, "--impls", "trl"))
    assert len(runs) == 2
    # TRL's loss holds the student's and the teacher's whole logits and their softmaxes
    assert runs["trl", "student", None]["peak_bytes"] >= 2 * LOGITS_BYTES


@pytest.mark.skipif(importlib.util.find_spec("trl") is not None, reason="TRL is installed")
def test_trl_missing_is_a_clear_refusal(tmp_path):
    done = _bench(tmp_path, "--impls", "trl")
    assert done.returncode == 2 and "uv sync --extra cpu --group bench" in done.stderr
