"""bench_teacher_transit at a tiny width on two ranks of the processes executor: both answers
are checked equal on the trained positions before the timing, and the trained positions'
answer is the smaller by the untrained positions' share."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_teacher_transit  # noqa: E402


def test_sends_fewer_bytes_for_the_same_answer(tmp_path, capsys):
    args = ["--out", str(tmp_path), "--hidden", "64", "--vocab", "256", "--rows", "6"]
    bench_teacher_transit.main([*args, "--prompt-len", "8", "--new-tokens", "16", "--repeats", "1"])
    result = json.loads((tmp_path / "results.json").read_text())["result"]
    shape = result["shape"]
    assert shape["rows"] == 6 and 8 + 8 <= shape["seq"] <= 8 + 16
    every, trained = result["every position"], result["trained positions"]
    ratio = trained["mib_sent"] / every["mib_sent"]
    assert ratio == pytest.approx(shape["trained"] / (shape["rows"] * shape["seq"]))
    assert ratio < 0.7
    assert every["seconds"] > 0 and trained["seconds"] > 0
    table = (tmp_path / "results.md").read_text()
    assert table.splitlines()[3].startswith("| trained positions | ")
    assert table in capsys.readouterr().out
