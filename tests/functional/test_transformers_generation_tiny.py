"""The whole loop on CPU with the transformers generation backend (policy.generation.backend
transformers: HfWorker engines instead of vLLM, as on a machine without vLLM): the tiny
default for a few lockstep steps, each refit checked against the student's own log-probs; the
tiny default as shipped (its own engine is this one), overlapped; and the tiny tool task, whose
rollouts take tool turns (a call, its result, the answer).

The runs share this driver process (one import) and run there: with one worker, the
executor is local (no Ray), as on a one-GPU machine without vLLM or Ray."""

import json
from pathlib import Path

from run_metrics import read_metrics
from short_runs import LOCKSTEP, short_run_args

from nemo_opd.cli import main
from nemo_opd.config import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
STEPS = 3
BACKEND = "policy.generation.backend=transformers"


def test_the_tiny_default_runs_on_the_transformers_backend(tmp_path, capsys):
    args = short_run_args(
        CONFIGS / "distillation_tiny.yaml",
        tmp_path,
        STEPS,
        BACKEND,
        *LOCKSTEP,
        "distillation.val_at_end=true",
        "distillation.max_val_samples=32",
        "distillation.val_batch_size=32",
    )
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "workers: one process (cluster.executor local, no Ray)" in out
    assert "1 transformers engine generating from the student's module on " in out  # lockstep
    metrics = read_metrics(tmp_path)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    for step in metrics.values():
        # fp32 on both sides: the engine samples from the student's own distribution
        assert step["generation/logprob_mismatch"] < 1e-4
        assert step["rollout/mean_generated_tokens"] > 0
    assert 0.0 <= metrics[STEPS]["validation/accuracy"] <= 1.0


def test_the_tiny_default_as_shipped_overlaps_on_its_own_copy(tmp_path, capsys):
    """distillation_tiny.yaml's own engine (the transformers backend in float32, its choice
    since vLLM is slower to start and to step at this size), overlapped as shipped: the engine
    holds its own copy of the student (the module trains while it generates), refit every
    step, and a checked step's rollouts are the student's own distribution."""
    args = short_run_args(
        CONFIGS / "distillation_tiny.yaml",
        tmp_path,
        4,
        "policy.generation.backend=transformers",  # the config's own, over the helper's auto
        "policy.generation.logprob_check_period=3",  # steps 1 and 4 checked, 2 and 3 overlap
    )
    cfg = load_config(CONFIGS / "distillation_tiny.yaml")
    assert cfg.policy.generation.backend == "transformers"
    assert cfg.policy.generation.transformers_cfg.precision == cfg.policy.precision == "float32"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "1 transformers engine on 1 thread" in out  # overlapped: half the cores, no sharing
    metrics = read_metrics(tmp_path)
    assert sorted(metrics) == [1, 2, 3, 4]
    for step in (1, 4):
        assert metrics[step]["generation/logprob_mismatch"] < 1e-4
    assert all(metrics[step]["timing/train/refit"] > 0 for step in (2, 3, 4))


def test_tool_turns_run_on_the_transformers_backend(tmp_path):
    from nemo_opd.tiny.assets import ensure_tiny_assets
    from nemo_opd.tiny.recipe import tools_recipe

    assets = ensure_tiny_assets(tools_recipe())
    args = short_run_args(
        CONFIGS / "distillation_tiny_tools.yaml",
        tmp_path,
        STEPS,
        BACKEND,
        *LOCKSTEP,
        f"policy.model_name={assets.teacher}",  # a student that calls the calculator
        "policy.generation.max_new_tokens=40",
        "logger.rollout_dump_period=1",
    )
    assert main(args) == 0
    metrics = read_metrics(tmp_path)
    assert sorted(metrics) == list(range(1, STEPS + 1))
    assert sum(metrics[step]["env/math/tool_calls"] for step in metrics) > 0
    for step in metrics.values():
        assert step["generation/logprob_mismatch"] < 1e-4
    dump = tmp_path / "logs" / "rollouts" / "step_1.jsonl"
    records = [json.loads(line) for line in dump.open()]
    with_tools = [r for r in records if any(m["role"] == "tool" for m in r["messages"])]
    assert with_tools
    for record in with_tools:
        roles = [m["role"] for m in record["messages"]]
        assert "<tool_call>" in record["messages"][roles.index("tool") - 1]["content"]
