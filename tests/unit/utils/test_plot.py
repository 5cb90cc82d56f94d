"""plot_metrics: a PNG from metrics.jsonl, skipping missing keys; clear errors otherwise."""

import json

import pytest

from nemo_opd.utils.plot import main, plot_comparison, plot_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def write_metrics(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_plot_writes_a_png_with_only_the_present_keys(tmp_path):
    records = [{"step": s, "train/loss": 1.0 / s} for s in range(1, 6)]
    records[2]["validation/accuracy"] = 0.5
    records[3]["train/loss"] = None  # a non-finite value logged as null is skipped
    metrics = write_metrics(tmp_path / "metrics.jsonl", records)
    out = plot_metrics(metrics, tmp_path / "plots" / "m.png", keys=("train/loss", "nope"))
    data = out.read_bytes()
    assert data[:8] == PNG_MAGIC and len(data) > 1000
    assert [p.name for p in out.parent.iterdir()] == ["m.png"]  # no temporary left


def test_empty_file_is_a_clear_error(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [])
    with pytest.raises(ValueError, match="no metrics records"):
        plot_metrics(metrics, tmp_path / "m.png")
    assert not (tmp_path / "m.png").exists()


def test_no_requested_key_names_the_logged_ones(tmp_path):
    metrics = write_metrics(tmp_path / "metrics.jsonl", [{"step": 1, "train/grad_norm": 1.0}])
    with pytest.raises(ValueError, match="train/grad_norm"):
        plot_metrics(metrics, tmp_path / "m.png")


def test_reference_lines_and_comparison(tmp_path):
    runs = {}
    for name, slope in (("a", 0.1), ("b", 0.2)):
        records = [
            {"step": s, "progress/rollouts": 64 * s, "validation/accuracy": slope * s}
            for s in range(4)
        ]
        runs[name] = write_metrics(tmp_path / f"{name}.jsonl", records)
    out = plot_metrics(
        runs["a"], tmp_path / "a.png", references={"validation/accuracy": ("teacher", 0.83)}
    )
    assert out.read_bytes()[:8] == PNG_MAGIC
    assert main(["compare", str(tmp_path / "c.png"), *(f"{k}={v}" for k, v in runs.items())]) == 0
    assert (tmp_path / "c.png").read_bytes()[:8] == PNG_MAGIC
    with pytest.raises(ValueError, match="train/reward"):
        plot_comparison(runs, tmp_path / "d.png", key="train/reward")


def test_compare_names_a_malformed_run(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["compare", str(tmp_path / "c.png"), "no-label"])
    assert "must be LABEL=path/to/metrics.jsonl" in capsys.readouterr().err
