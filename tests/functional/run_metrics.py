"""A run's logged metrics, as the functional tests read and compare them."""

import json
from pathlib import Path

import pytest


def read_metrics(run_dir: Path) -> dict[int, dict]:
    """{step: every metric logged for that step} from run_dir/logs/metrics.jsonl (a step's
    records merged; {} while the file does not exist yet)."""
    path = Path(run_dir) / "logs" / "metrics.jsonl"
    by_step = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    return by_step


RESUME_COMPARED = (
    "train/loss",
    "train/forward_kl",
    "train/reverse_kl",
    "train/reward",
    "validation/accuracy",
    "validation/reverse_kl",
)
"""What a resumed run must log as the uninterrupted one did, at every step."""


def assert_resumed_like(resumed: dict[int, dict], straight: dict[int, dict], steps) -> None:
    """The resumed run logged the same steps as the straight one and, at each of `steps`, the
    same RESUME_COMPARED metrics (those the straight run logged), within 1e-4 relative."""
    assert sorted(resumed) == sorted(straight)
    for step in steps:
        for key in RESUME_COMPARED:
            if key in straight[step]:
                assert resumed[step][key] == pytest.approx(
                    straight[step][key], rel=1e-4, abs=1e-6
                ), f"step {step} {key}: resumed {resumed[step][key]} vs {straight[step][key]}"
