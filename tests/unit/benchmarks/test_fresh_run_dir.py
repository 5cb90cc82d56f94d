"""A benchmark run again with the same --out measures a new run of the loop: the harness
removes the earlier run's checkpoints and logs (and nothing else) before it launches.

Before: a second `bench_wide_vocab.py` or `bench_vs_trl.py` with the same --out started the loop
in the first run's folders, where it resumed the finished run or said there was nothing to do
(and the benchmark read the old run's metrics as the new one's); a run with checkpointing off
is now refused there, since it would write its final model over the earlier one.
"""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "benchmarks"))

from harness import fresh_run_dir  # noqa: E402

from nemo_opd.config import load_config  # noqa: E402
from nemo_opd.errors import SetupError  # noqa: E402
from nemo_opd.utils.export_folder import export_directory  # noqa: E402
from nemo_opd.utils.run_dirs import with_absolute_paths  # noqa: E402
from nemo_opd.utils.run_identity import check_run_folders, record_log_owner  # noqa: E402

TINY = Path(__file__).resolve().parents[3] / "examples" / "configs" / "distillation_tiny.yaml"


def test_a_benchmark_run_again_starts_the_loop_afresh(tmp_path, capsys):
    run_dir = tmp_path / "out" / "nemo_opd"
    overrides = [
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "checkpointing.enabled=false",
    ]
    cfg = with_absolute_paths(load_config(TINY, overrides))
    with export_directory(run_dir / "checkpoints" / "final_model", {"step": 350}) as folder:
        (folder / "config.json").write_text("{}")
    record_log_owner(cfg)  # an earlier run of the same benchmark
    (run_dir / "logs" / "metrics.jsonl").write_text('{"step": 350}\n')
    (run_dir / "notes.txt").write_text("the benchmark's own")
    with pytest.raises(SetupError, match="exported at step 350"):
        check_run_folders(cfg)  # the loop would not start there
    assert fresh_run_dir(run_dir) == run_dir
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]
    assert "an earlier run's checkpoints and logs removed" in capsys.readouterr().out
    assert check_run_folders(cfg) is None
    assert fresh_run_dir(tmp_path / "new").is_dir()
