"""The lines that end a run: steps and wall time, the held-out accuracy at the first and last
validation (the teacher's where known), and where the final model and the logs are."""

import json

from nemo_opd.utils.run_summary import RunOutcome, format_duration, format_run_summary


def write_metrics(log_dir, records):
    log_dir.mkdir(parents=True, exist_ok=True)
    lines = "".join(json.dumps(record) + "\n" for record in records)
    (log_dir / "metrics.jsonl").write_text(lines + '{"step": 351, "validation/acc')  # torn
    (log_dir / "curves.png").write_bytes(b"")


def outcome(tmp_path, **changes):
    fields = {
        "step": 350,
        "total_steps": 350,
        "resumed_step": 0,
        "seconds": 201.4,
        "log_dir": tmp_path / "logs",
        "final_model": tmp_path / "checkpoints" / "final_model",
        "teacher_accuracy": (0.832, "measured at its build"),
    }
    return RunOutcome(**{**fields, **changes})


def test_a_finished_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    records = [{"step": 0, "validation/accuracy": 0.342}, {"step": 1, "train/loss": 0.2}]
    records += [
        {"step": 175, "validation/accuracy": 0.5},
        {"step": 350, "validation/accuracy": 0.606},
    ]
    write_metrics(tmp_path / "logs", records)
    lines = format_run_summary(outcome(tmp_path)).splitlines()
    assert lines == [
        "run done:          350 of 350 steps in 3 min 21 s",
        "held-out accuracy: 34.2% (step 0) -> 60.6% (step 350)",
        "teacher:           83.2% held-out (measured at its build)",
        "final model:       checkpoints/final_model",
        "metrics:           logs/metrics.jsonl",
        "curves:            logs/curves.png",
    ]
    assert max(map(len, lines)) <= 80


def test_a_stopped_resumed_run_without_validation(tmp_path):
    summary = format_run_summary(
        outcome(tmp_path, step=180, resumed_step=175, final_model=None, teacher_accuracy=None)
    )
    assert summary.splitlines() == [
        "run stopped:       after step 180 of 350 in 3 min 21 s, resumed from step 175; the "
        "same command resumes it",
        "held-out accuracy: not recorded (no validation in metrics.jsonl)",
        "final model:       not exported (the run stopped before its end)",
    ]


def test_durations():
    assert [format_duration(s) for s in (4.6, 59.4, 61, 3599, 3600, 7500)] == [
        "5 s",
        "59 s",
        "1 min 1 s",
        "59 min 59 s",
        "1 h 00 min",
        "2 h 05 min",
    ]
