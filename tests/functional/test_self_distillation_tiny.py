"""Self-distillation in the loop: examples/configs/distillation_tiny_self.yaml, short runs with
each teacher source (the student's live weights, an EMA of them, a lagged snapshot).

- Straight through, all three sources in the test's process (the config's one worker: the
  local executor, everything in that process) with the config's objective (GRPO plus the
  sampled-token reverse KL to the teacher), and the top-k divergence to the EMA from its top-k
  and from its hidden states (the full vocabulary): no teacher model is built or started (the
  student's worker scores as the teacher), every
  source grades step 1 with the initial weights (the same loss), the EMA and the snapshot are
  saved in the checkpoints with the number of steps they hold, the live student saves none.
- SIGKILL mid-run, then the same command: it resumes from the newest checkpoint and logs the
  uninterrupted run's metrics. ema: the run's one process killed (the local executor: nothing
  can clean up); lagged on Ray: the student's worker killed (the run ends with one message, no
  teacher worker is placed). The executors log the same metrics (test_executors_tiny.py).
"""

import itertools
import json
import math
import os
import re
import signal
import sys
from pathlib import Path

import psutil
import pytest
import run_configs
from run_metrics import assert_resumed_like, read_metrics
from run_process import Run, run_to_end
from short_runs import short_run_args

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "examples" / "configs"
CONFIG = CONFIGS / "distillation_tiny_self.yaml"
STEPS = 4
SOURCES = ("student", "ema", "lagged")
CHECKPOINTS = ("checkpointing.enabled=true", "checkpointing.metric_name=null")
TEACHER = ("teacher.ema_decay=0.5", "teacher.refresh_steps=2")
"""An average that moves visibly in a few steps; a snapshot taken after step 2 and step 4."""


SELF_OVERRIDES = [
    "teacher.model_name=null",
    "~teacher.tokenizer",
    "teacher.prompt_template='{prompt} {answer}'",
]
"""distillation_tiny_100_lockstep.yaml's teacher model turned into the student itself (its top-k
objective)."""


def args(source: str, run_dir: Path, *extra: str, config: Path = CONFIG) -> list[str]:
    return short_run_args(
        config, run_dir, STEPS, f"teacher.source={source}", *TEACHER, *CHECKPOINTS, *extra
    )


def command(source: str, run_dir: Path, *extra: str) -> list[str]:
    script = ROOT / "examples" / "run_distillation_math.py"
    return [sys.executable, str(script), *args(source, run_dir, *extra)]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The three sources' uninterrupted runs and the EMA's with the top-k objective (its top-k,
    and its hidden states for the full vocabulary), in this process (tests/functional/
    run_configs.py): {name: (run dir, its stdout)}."""
    root = tmp_path_factory.mktemp("self_straight")
    plan = {source: (source, CONFIG, []) for source in SOURCES}
    topk = CONFIGS / "distillation_tiny_100_lockstep.yaml"
    plan["ema_topk"] = ("ema", topk, SELF_OVERRIDES)
    plan["ema_full_vocab"] = ("ema", topk, [*SELF_OVERRIDES, "loss_fn.support=full"])
    dirs = {name: root / name for name in plan}
    spec = [
        {"args": args(source, dirs[name], "checkpointing.save_period=2", *extra, config=config)}
        for name, (source, config, extra) in plan.items()
    ]
    output = run_configs.run_here(spec)
    assert len(output) == len(plan)
    for part in output:
        assert part.rstrip().endswith(" 0"), part[-3000:]
    return {name: (dirs[name], part) for name, part in zip(plan, output, strict=True)}


def started(out: str) -> list[str]:
    """The processes and parts the start-up report lists ("driver", "policy.0", "vllm.0")."""
    report = out.split("start-up (s after the command started", 1)[1].splitlines()[1:]
    rows = itertools.takewhile(lambda x: x.startswith("  "), report)
    return [line.split()[0] for line in rows if not line.startswith("   ")]  # not a row's rest


def test_each_source_and_objective_runs_with_the_student_as_its_only_model(straight):
    for source, (run_dir, out) in straight.items():
        workers = "workers: one process (cluster.executor local, no Ray): the student, 1 vLLM"
        # "the student, the teacher, " with one; the line is wrapped at the console's width
        assert workers in " ".join(out.split()), (source, out[:3000])
        assert started(out) == ["driver", "policy.0", "vllm.0"], (source, started(out))
        metrics = read_metrics(run_dir)
        assert sorted(metrics) == list(range(1, STEPS + 1)), source
        assert all(math.isfinite(metrics[s]["train/loss"]) for s in metrics), source
        kl = "train/sampled_reverse_kl" if source in SOURCES else "train/forward_kl"
        assert abs(metrics[1][kl]) > 1e-3, (source, metrics[1])  # the answer in view changes it

    # Step 1 is graded by the initial weights whatever the source: the same rollouts, scores
    # and loss; from step 2 the live student, its average and its snapshot differ.
    first = {source: read_metrics(straight[source][0])[1]["train/loss"] for source in SOURCES}
    assert first["ema"] == first["student"] == first["lagged"], first
    second = {source: read_metrics(straight[source][0])[2]["train/loss"] for source in SOURCES}
    assert len(set(second.values())) == 3, second


def test_the_ema_and_the_snapshot_are_checkpointed(straight):
    for source in SOURCES:
        run_dir = straight[source][0]
        for step in (2, 4):
            folder = run_dir / "checkpoints" / f"step_{step}" / "policy" / "teacher"
            if source == "student":
                assert not folder.exists()
                continue
            assert (folder / "model.safetensors").is_file(), (source, step)
            state = json.loads((folder / "teacher_state.json").read_text())
            assert state == {"source": source, "updates": step}


@pytest.mark.slow  # two more runs per case: `pytest -m slow`
@pytest.mark.parametrize("source, executor", [("ema", "local"), ("lagged", "ray")])
def test_sigkill_mid_run_resumes_like_the_straight_run(source, executor, straight, tmp_path):
    faulty = command(
        source, tmp_path, "checkpointing.save_period=1", f"cluster.executor={executor}"
    )
    run = Run(faulty, tmp_path)
    run.wait_for_checkpoint(2)
    if executor == "local":  # the whole run is this one process
        children = psutil.Process(run.process.pid).children(recursive=True)
        os.kill(run.process.pid, signal.SIGKILL)
        code, _, err = run.finish()
        assert code == -signal.SIGKILL, err[-3000:]
        _, alive = psutil.wait_procs(children, timeout=60)
        assert not alive, [child.pid for child in alive]  # nothing it started outlives it
    else:
        placed = json.loads((tmp_path / "logs" / "placement.json").read_text())["workers"]
        assert sorted(placed) == ["policy", "vllm"], placed  # no teacher worker
        victim = run.policy_workers()[0]
        os.kill(victim, signal.SIGKILL)
        code, _, err = run.finish()
        assert code == 1, err[-3000:]
        assert re.search(rf"worker rank \d died \(pid {victim}", err), err[-3000:]

    out = run_to_end(faulty, tmp_path).stdout
    resumed = re.search(r"resumed from \S+step_(\d+) \(step \d+\)", out)
    assert resumed and 2 <= int(resumed.group(1)) < STEPS, out[-3000:]
    straight_metrics = read_metrics(straight[source][0])
    assert_resumed_like(read_metrics(tmp_path), straight_metrics, range(1, STEPS + 1))
