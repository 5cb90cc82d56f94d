"""The whole loop on CPU: the tiny config on two one-thread workers per model with tensor
parallelism 2, sequence packing and two-turn rollouts (a retry after a wrong answer), run
straight through in lockstep, and the same config overlapped (distillation.max_staleness 1, the
refit check every third step), which samples by its schedule, both as processes of this machine
(cluster.executor=processes). Then the overlapped run through a chain of real faults, each
ending the run with one clear message and each resumed from the newest intact checkpoint by
the same command: SIGTERM (a clean stop with a checkpoint, no worker left behind), a training
worker killed while rollouts are ahead of training (they are saved with the checkpoint), the
vLLM engine killed between steps (as the OOM killer does), the newest checkpoint damaged on
disk. Every run's workers are processes of this machine (the processes executor, which names
each worker's process after its class, as Ray does: the test finds the one it kills by that
name; killing Ray's actors mid-run is tested in test_lora_tiny.py and
test_self_distillation_tiny.py). The run that finally completes must log the same
metrics as the uninterrupted overlapped one. (A save that
fails part-way is caused for real one level down, in tests/unit/policy/test_policy_checkpoint.py:
the loop adds only the message.)

The models are the seconds-long "micro" build of the tiny assets (the default tiny models take
minutes to build): this test checks the machinery, not the learning curve (docs/tiny_run.md
records that).
"""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import run_configs
import run_process
import torch
from run_metrics import assert_resumed_like, read_metrics
from run_process import Run
from short_runs import GENERATION_AUTO

from nemo_opd.tiny.assets import ensure_tiny_assets
from nemo_opd.tiny.recipe import micro_recipe

pytest.importorskip("vllm")

ROOT = Path(__file__).resolve().parents[2]
STEPS = 6


@pytest.fixture(scope="module")
def micro_assets():
    return ensure_tiny_assets(micro_recipe())


def overrides(assets, run_dir: Path) -> list[str]:
    return [
        f"policy.model_name={assets.student}",
        f"policy.tokenizer.name={assets.tokenizer}",
        f"teacher.model_name={assets.teacher}",
        f"teacher.tokenizer.name={assets.tokenizer}",
        "data.dataset_name=null",  # the micro build's own 400 problems: quicker to encode
        f"data.train_path={assets.train_file}",
        f"data.val_path={assets.validation_file}",
        f"distillation.max_num_steps={STEPS}",
        "distillation.num_prompts_per_step=8",
        "distillation.num_generations_per_prompt=2",
        "distillation.max_rollout_turns=2",
        "distillation.val_period=2",
        "distillation.max_val_samples=16",
        "distillation.val_batch_size=16",
        "env.math.retry_on_wrong=true",
        "policy.train_global_batch_size=8",
        "policy.train_micro_batch_size=4",
        "policy.generation.max_new_tokens=12",
        "policy.generation.logprob_check_samples=5",  # of 16 rollouts per step
        "cluster.executor=processes",  # processes of this machine, without Ray
        "cluster.gpus_per_node=2",  # the config's one worker per model, as two
        "cluster.cpus_per_worker=1",
        "policy.dtensor_cfg.tensor_parallel_size=2",
        "policy.sequence_packing.enabled=true",
        "teacher.sequence_packing.enabled=true",
        "policy.dynamic_batching.enabled=false",  # the shipped config's (exclusive with packing)
        "teacher.dynamic_batching.enabled=false",
        "distillation.max_staleness=0",  # lockstep, checked every step: OVERLAP overlaps
        "policy.generation.logprob_check_period=null",
        "checkpointing.save_period=2",
        f"checkpointing.checkpoint_dir={run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        "logger.rollout_dump_period=2",
        GENERATION_AUTO,  # vLLM, whose engine the fault chain kills
    ]


def command(assets, run_dir: Path) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "examples" / "run_distillation_math.py"),
        "--config",
        str(ROOT / "examples" / "configs" / "distillation_tiny.yaml"),
        *overrides(assets, run_dir),
    ]


def run_to_end(assets, run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    return run_process.run_to_end([*command(assets, run_dir), *extra], run_dir)


def start_run(assets, run_dir: Path, *extra: str) -> Run:
    return Run([*command(assets, run_dir), *extra], run_dir)


def assert_exported_student_is_trained(final: Path, last_checkpoint: Path, initial: Path):
    """The exported student loads with from_pretrained, equals the last checkpoint's weights and
    differs from the initial student."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(final)
    exported = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    saved = load_file(last_checkpoint / "model.safetensors")
    start = load_file(initial / "model.safetensors")
    for name, tensor in exported.items():
        assert torch.equal(tensor, saved[name].to(tensor.dtype)), name
    assert any(not torch.equal(exported[n], start[n].to(exported[n].dtype)) for n in start)


OVERLAP = ("distillation.max_staleness=1", "policy.generation.logprob_check_period=3")
"""Every third step from step 1 sampled from the newest weights and checked; the others one
step stale."""
FRESH = {step for step in range(1, STEPS + 1) if (step - 1) % 3 == 0}


@pytest.fixture(scope="module")
def uninterrupted(micro_assets, tmp_path_factory):
    """The two uninterrupted runs, lockstep and overlapped (max_staleness 1), one after the other
    in this process (tests/functional/run_configs.py: they share its imports and fork server):
    {"lockstep"/"overlapped": (run dir, metrics, stdout)}."""
    root = tmp_path_factory.mktemp("uninterrupted")
    plan = {"lockstep": (), "overlapped": OVERLAP}
    spec = [  # the command's arguments after the script's name
        {"args": [*command(micro_assets, root / name)[2:], *extra]} for name, extra in plan.items()
    ]
    outputs = run_configs.run_here(spec)
    runs = {}
    for (name, _), out in zip(plan.items(), outputs, strict=True):
        assert out.rstrip().endswith(" 0"), out[-3000:]
        runs[name] = (root / name, read_metrics(root / name), out)
    return runs


def test_tiny_distillation_runs(micro_assets, uninterrupted):
    straight, metrics, stdout = uninterrupted["lockstep"]
    # Every step logged once, with the loop's metrics.
    assert sorted(metrics) == list(range(STEPS + 1))  # step 0: validation at start
    for step in range(1, STEPS + 1):
        row = metrics[step]
        for key in (
            "train/loss",
            "train/forward_kl",
            "train/reverse_kl",
            "train/reward",
            "train/tokens_per_sec",
            "timing/train/total_step_time",
            "generation/logprob_mismatch",
            "rollout/mean_turns",
        ):
            assert key in row, f"step {step} lacks {key}"
        assert row["generation/logprob_mismatch"] < 1e-3  # fp32 vLLM == fp32 student
        assert 1.0 <= row["rollout/mean_turns"] <= 2.0
    assert any(metrics[step]["rollout/mean_turns"] > 1.0 for step in range(1, STEPS + 1))
    for step in range(0, STEPS + 1, 2):
        assert "validation/accuracy" in metrics[step]
        # The driver's own phases add up to at most the whole; the student's evaluation runs
        # in a thread beside the next chunk's generation (the tail of it is the wait).
        phases = ("generation", "teacher_topk", "student_eval_wait")
        parts = [metrics[step][f"timing/validation/{phase}"] for phase in phases]
        assert 0 < sum(parts) <= metrics[step]["timing/validation"]
        assert metrics[step]["timing/validation/student_eval"] > 0
    assert (straight / "logs" / "rollouts" / "step_2.jsonl").exists()
    assert (straight / "logs" / "curves.png").stat().st_size > 0
    final = straight / "checkpoints" / "final_model"
    assert (final / "config.json").exists() and (final / "tokenizer.json").exists()
    assert_exported_student_is_trained(
        final, straight / "checkpoints" / f"step_{STEPS}" / "policy", micro_assets.student
    )
    print(stdout[-2000:])


def test_overlap_samples_by_the_schedule(uninterrupted):
    lockstep = uninterrupted["lockstep"][1]
    run_dir, metrics, _ = uninterrupted["overlapped"]
    assert sorted(metrics) == sorted(lockstep)
    # Step 1 trains the initial weights on their own rollouts under both schedules.
    for key in ("train/loss", "train/reward", "train/num_tokens", "rollout/mean_turns"):
        assert metrics[1][key] == pytest.approx(lockstep[1][key], rel=1e-4), key
    # Step t samples from the weights after step max(0, t - 2), but for the refit check's
    # steps (FRESH: logprob_check_period 3), which sample from the newest weights.
    for step in range(1, STEPS + 1):
        assert metrics[step]["rollout/weights_version"] == (step - 1 if step in FRESH else step - 2)
        assert metrics[step]["rollout/staleness_max"] == (0 if step in FRESH else 1)
        assert lockstep[step]["rollout/weights_version"] == step - 1
        assert lockstep[step]["rollout/staleness_max"] == 0
    # vLLM is compared with the student only where the trained weights sampled: the checked
    # steps, each after a refit to the newest weights.
    for step in range(1, STEPS + 1):
        assert ("generation/logprob_mismatch" in metrics[step]) == (step in FRESH), step
    assert all(metrics[step]["generation/logprob_mismatch"] < 1e-3 for step in FRESH)
    records = (run_dir / "logs" / "rollouts" / "step_2.jsonl").read_text().splitlines()
    assert records and all('"weights_version": 0' in line for line in records)
    assert metrics[2]["train/loss"] != lockstep[2]["train/loss"]  # stale rollouts differ


FAULTY = ("checkpointing.save_period=1", "checkpointing.metric_name=null", *OVERLAP)
"""The overlapped run, checkpointed after every step: each checkpoint after which rollouts are
ahead of training holds them."""


def newest_checkpoint(checkpoints: Path) -> int:
    return max(int(p.name.split("_")[1]) for p in checkpoints.glob("step_*"))


def test_faults_end_runs_cleanly_and_resume_exactly(micro_assets, uninterrupted, tmp_path):
    """One overlapped run through a chain of faults, each resumed by the same command."""
    straight = uninterrupted["overlapped"][1]
    checkpoints = tmp_path / "checkpoints"

    # 1. SIGTERM to the driver: the step in progress finishes, a checkpoint is saved, exit 143
    # (its workers processes of this machine: the driver's signal, not Ray's).
    run = start_run(micro_assets, tmp_path, *FAULTY)
    run.wait_for_checkpoint(1)
    workers = psutil.Process(run.process.pid).children(recursive=True)
    os.kill(run.process.pid, signal.SIGTERM)
    code, out, err = run.finish()
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, f"processes that outlived the driver: {alive}"
    assert code == 128 + signal.SIGTERM, err[-3000:]
    stopped = int(re.search(r"stopped after step (\d+) on SIGTERM", out).group(1))
    assert 1 <= stopped <= 2, out[-2000:]
    assert (checkpoints / f"step_{stopped}").is_dir() and not (checkpoints / "final_model").exists()

    # 2. A training worker killed while rollouts are ahead of training: one line naming it,
    # exit 1. The rollouts of the step after each checkpoint come from older weights than it
    # holds: they are saved with it, and the next run trains on them as the straight run did.
    run = start_run(micro_assets, tmp_path, *FAULTY)
    run.wait_for_checkpoint(stopped + 1)
    victim = run.policy_workers()[0]
    os.kill(victim, signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 1, err[-3000:]
    assert f"resumed from {checkpoints / f'step_{stopped}'}" in out
    assert re.search(rf"error: .*\w+: worker rank \d died \(pid {victim}", err), err[-3000:]
    assert "Traceback" not in err.split("error: ")[-1]
    killed = newest_checkpoint(checkpoints)
    assert killed < STEPS - 1, out[-2000:]
    assert (checkpoints / f"step_{killed}" / "rollouts_ahead.pt").is_file()

    # 3. The vLLM engine killed (the OOM killer's way): one line naming it, no hang, exit 1.
    run = start_run(micro_assets, tmp_path, *FAULTY)
    run.wait_for_checkpoint(killed + 1)
    victim = run.generation_workers()[0]
    os.kill(victim, signal.SIGKILL)
    code, out, err = run.finish()
    assert code == 1, err[-3000:]
    assert f"resumed from {checkpoints / f'step_{killed}'}" in out
    assert "were not saved with the checkpoint" not in out
    engine = r"vLLM engine \d \(of \d, serving [^)\n]*\)"
    died = rf"error: {engine} died \(pid {victim}: [^\n]*\) while [^\n]* from the newest\n"
    assert re.search(died, err), err[-3000:]
    assert "Traceback" not in err.split("error: vLLM engine")[-1]

    # 4. The newest checkpoint damaged on disk: set aside (kept, with the reason) on resume,
    # and the same command once more completes, with the uninterrupted run's metrics.
    newest = newest_checkpoint(checkpoints)
    weights = checkpoints / f"step_{newest}" / "policy" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    out = run_to_end(micro_assets, tmp_path, *FAULTY).stdout
    assert f"checkpoint not resumable, set aside as {checkpoints / 'unreadable'}" in out
    assert f"step_{newest}" in out and "has 1000 bytes" in out and "written" in out
    assert f"resumed from {checkpoints / f'step_{newest - 1}'}" in out
    assert "were not saved with the checkpoint" not in out
    assert (checkpoints / "unreadable" / f"step_{newest}").is_dir()
    assert_resumed_like(read_metrics(tmp_path), straight, range(1, STEPS + 1))
