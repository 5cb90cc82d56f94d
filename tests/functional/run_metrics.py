"""A run's logged metrics, as the functional tests read them."""

import json
from pathlib import Path


def read_metrics(run_dir: Path) -> dict[int, dict]:
    """{step: every metric logged for that step} from run_dir/logs/metrics.jsonl (a step's
    records merged; {} while the file does not exist yet)."""
    path = Path(run_dir) / "logs" / "metrics.jsonl"
    by_step = {}
    for line in path.read_text().splitlines() if path.exists() else []:
        record = json.loads(line)
        by_step.setdefault(record["step"], {}).update(record)
    return by_step
