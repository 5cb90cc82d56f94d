"""bench_executors on the processes executor alone (Ray's side is the same code with another
executor name): every repeat starts, answers and stops a two-rank policy, the first start is
reported apart, and a later start is the fork's, far below the fork server's first."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))
import bench_executors  # noqa: E402


def test_starts_calls_and_stops_a_two_rank_policy(tmp_path, capsys):
    bench_executors.main(["--out", str(tmp_path), "--executors", "processes", "--repeats", "2"])
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]["processes"]
    assert len(runs) == 2
    for run in runs:
        assert run["start_s"] > 0 and run["call_s"] > 0 and run["stop_s"] >= 0
    assert runs[1]["start_s"] < 5.0  # a fork, not an interpreter's imports
    table = (tmp_path / "results.md").read_text()
    assert table.splitlines()[2].startswith("| processes | ")
    assert table in capsys.readouterr().out
