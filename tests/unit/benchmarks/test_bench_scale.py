"""bench_scale end to end at a small size: every implementation runs in its own process, the
JSON holds one record per run, and the chunked paths' measured peak is a fraction of the whole
logits' (what the benchmark exists to show, so a chunked path that materialises [N, V] fails
here). No address-space cap: the largest run needs ~2.3 GiB, and a cap on address space also
counts the allocator arenas and thread stacks a many-core machine reserves."""

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_chunked_peak_is_a_fraction_of_the_whole_logits(tmp_path):
    out = tmp_path / "scale.json"
    command = [
        sys.executable, str(REPO / "benchmarks" / "bench_scale.py"), "--vocab=32000",
        "--hidden=64", "--tokens", "2048", "--k=16", "--chunk", "64", "256", "--repeats=1",
        "--threads=1", "--memory-gb=0", f"--json={out}",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["meta"]["vocab"] == 32000 and report["meta"]["chunk"] == [64, 256]
    runs = {(r["impl"], r["path"], r.get("chunk")): r for r in report["results"]}
    assert len(runs) == 8  # chunked at 2 sizes + unchunked + trl, for both paths
    failed = [r for r in runs.values() if r["seconds"] is None or "error" in r]
    assert not failed, failed
    logits_bytes = 2048 * 32000 * 4
    for path in ("student", "teacher"):
        whole = runs["unchunked", path, None]["peak_bytes"]
        assert whole >= logits_bytes  # the [N, V] logits at least
        # A chunk's working set is a few [C, V] buffers: at C = N / 32 under a quarter of the
        # whole logits' peak (one [N, V] fp32 tensor alone, logits_bytes, is ~45% of it), at
        # C = N / 8 under half (allocator slack makes its exact peak vary between runs).
        small, large = (runs["chunked", path, c]["peak_bytes"] for c in (64, 256))
        assert small < whole / 4 and large < whole / 2, (path, small, large, whole)
    # TRL's loss holds the student's and the teacher's whole logits and their softmaxes
    assert runs["trl", "student", None]["peak_bytes"] >= 2 * logits_bytes
