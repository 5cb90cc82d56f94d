"""Refit that copies nothing: in one process (the local executor), in lockstep, the transformers
engine generates from the student's own module, and a run logs what the same run with a
copying refit (transformers_cfg.share_student=false: a copy refit from the gathered weights
each step) logs: the same rollouts, token for token, and the same metrics (equal in float32,
allowing for rounding since the same weights sit in other tensors, whose matrix kernels may sum
a padded batch in another order; equal in bfloat16, the student under FSDP2 at world size 1,
its parameters gathered for each generation call). The sharing run gathers no weights and copies
none: its engine never loaded any (its refit time stays 0) and holds the student's module.

Both runs of each pair run in this process, one after the other (no Ray)."""

import json
from pathlib import Path

import pytest
from run_metrics import read_metrics
from short_runs import LOCKSTEP, short_run_args

from nemo_opd.algorithms.distillation import distillation_train
from nemo_opd.algorithms.setup import setup
from nemo_opd.cli import build_parser
from nemo_opd.config import load_config

ROOT = Path(__file__).resolve().parents[2]
STEPS = 3
NOT_COMPARED = ("timing/", "progress/", "train/tokens_per_sec")
TOLERANCE = {"float32": 1e-6, "bfloat16": 0.0}
"""Relative and absolute: float32 runs logged equal numbers on the machine this was written on;
rounding is allowed for (the engine's unit test sees 1-ulp log-prob differences in a padded
batch). bf16: the same weights through the same ops, equal."""


def run(run_dir: Path, precision: str, share: bool) -> dict:
    """The run's metrics, rollouts and what its generation engine did."""
    args = short_run_args(
        ROOT / "examples" / "configs" / "distillation_tiny.yaml",
        run_dir,
        STEPS,
        *LOCKSTEP,
        "policy.generation.backend=transformers",
        f"policy.generation.transformers_cfg.share_student={str(share).lower()}",
        f"policy.precision={precision}",
        "distillation.val_at_end=true",
        "distillation.max_val_samples=32",
        "distillation.val_batch_size=16",
        "logger.rollout_dump_period=1",
    )
    parsed = build_parser().parse_args(args)
    cfg = load_config(parsed.config, parsed.overrides)
    assert cfg.cluster.executor == "auto"  # one worker, no Ray: the local executor
    state = setup(cfg)
    try:
        assert distillation_train(state)
        engine = state.generation.engines.workers[0]
        shared = {
            "shares_student": state.generation.shares_student,
            "engine_holds_the_student": engine.model is state.student.local_module(),
            "refit_time_s": state.generation.last_refit_time_s,
            "loaded_version": state.generation.loaded_version,
        }
    finally:
        state.shutdown()
    rollouts = {
        step: [json.loads(line) for line in (run_dir / "logs" / "rollouts" / f"step_{step}.jsonl")
               .read_text().splitlines()]
        for step in range(1, STEPS + 1)
    }  # fmt: skip
    return {"metrics": read_metrics(run_dir), "rollouts": rollouts, **shared}


@pytest.mark.parametrize("precision", ["float32", "bfloat16"])
def test_a_shared_module_run_logs_the_copying_runs_rollouts_and_metrics(tmp_path, precision):
    shared = run(tmp_path / "shared", precision, share=True)
    copying = run(tmp_path / "copying", precision, share=False)
    assert shared["shares_student"] and shared["engine_holds_the_student"]
    assert shared["refit_time_s"] == 0.0 and shared["loaded_version"] == STEPS
    assert not copying["shares_student"] and copying["refit_time_s"] > 0.0
    assert shared["rollouts"] == copying["rollouts"]
    assert sorted(shared["metrics"]) == sorted(copying["metrics"]) == list(range(1, STEPS + 1))
    assert "validation/accuracy" in shared["metrics"][STEPS]
    for step, row in copying["metrics"].items():
        compared = {k: v for k, v in row.items() if not k.startswith(NOT_COMPARED)}
        for key, value in compared.items():
            assert shared["metrics"][step][key] == pytest.approx(
                value, rel=TOLERANCE[precision], abs=TOLERANCE[precision]
            ), f"step {step} {key}"
        assert shared["metrics"][step]["generation/logprob_mismatch"] < (
            1e-4 if precision == "float32" else 0.05
        )
