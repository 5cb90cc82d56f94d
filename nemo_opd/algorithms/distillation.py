"""On-policy distillation: the student samples, the frozen teacher grades every token, and the
student is trained to match the teacher on the states it visited.

    run(cfg)  =  setup(cfg)  ->  distillation_train(run)  ->  export the final student

setup (algorithms/setup.py) builds the run; this module is the loop. One step, in order:
    1. refit     push the student's weights into vLLM, only when they changed
    2. rollout   run_multi_turn_rollout over the math environment; or, on an off-policy step
                 (distillation.lmbda < 1, objective.loss sft), the dataset's responses
                 (reference_rollout) or the teacher's samples (distillation.seq_kd), without
                 refit
    3. flatten   message logs -> input_ids, input_lengths, token_mask, sample_mask
    4. teacher   what the objective uses (teachers.base.Teacher.score): top-k log-probs and ids
                 of every position, and/or the log-prob of every sampled token (no teacher at
                 all for reward-only RL), whatever kind of teacher it is
    5. advantage (objective.loss policy_gradient) the student's log-probs before the update,
                 vLLM's sampling log-probs, and the advantages (nemo_opd.algorithms.advantages)
    6. train     student.train with the objective's loss (DistillationLossFn or
                 PolicyGradientLossFn; one optimizer step per global batch)
    7. validate  every val_period steps: greedy accuracy, avg@k, average length, validation KL
    8. save/log  checkpoint every save_period steps; metrics to console, JSONL, TensorBoard

Steps 1-4 (algorithms/step_rollouts.py) run in the rollout producer's thread
(algorithms/rollout_pipeline.py), 5-8 here. Step t's rollouts are sampled from the weights
after step max(0, t - 1 - distillation.max_staleness): with 0 the producer makes step t after
step t - 1 is trained (lockstep, each phase waiting for the one before); with s > 0 it makes
the next s steps while the loop trains, so generation, the teacher and training overlap.
Validation and checkpoints hold the producer while they run; a checkpoint also saves the
rollouts made ahead of it (they come from weights it does not hold).

The run ends after distillation.max_num_steps steps or when the loader would start epoch
distillation.max_num_epochs, whichever comes first; that step validates (val_at_end) and saves
like the last one.

Resuming is automatic: when checkpointing.checkpoint_dir holds a checkpoint, the student,
optimizer, data position, step and rollouts made ahead are restored, and sampling seeds depend
only on (seed, step), so the resumed run continues exactly as an uninterrupted one would.
"""

from __future__ import annotations

import time
from collections import defaultdict
from functools import partial
from pathlib import Path
from typing import Any

import torch

from nemo_opd.algorithms.advantages import compute_advantages, group_ids_for
from nemo_opd.algorithms.data_mix import is_on_policy_step
from nemo_opd.algorithms.objective import sampling_temperature
from nemo_opd.algorithms.prompts import repeat_samples
from nemo_opd.algorithms.resume import ROLLOUTS_AHEAD_FILE, ROLLOUTS_AHEAD_KEY
from nemo_opd.algorithms.rollout_pipeline import PlannedStep, ProducedStep, StepPipeline
from nemo_opd.algorithms.run_state import DistillationRun
from nemo_opd.algorithms.setup import rollouts_per_step, setup
from nemo_opd.algorithms.step_rollouts import (
    VERSION_KEY,
    is_checked_step,
    keep_only_scheduled,
    plan_steps,
    produce_step,
    rollout_with,
    scheduled_version,
    score_rollout,
    staleness_metrics,
)
from nemo_opd.algorithms.student_evaluation import StudentEvaluation
from nemo_opd.config import DistillationConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.message_log import flatten_generation_logprobs
from nemo_opd.errors import RunError, ServiceError
from nemo_opd.generation import logprob_mismatch
from nemo_opd.generation.interface import IN_PLACE
from nemo_opd.losses import build_loss_mask
from nemo_opd.losses.reduction import metric_reduction
from nemo_opd.policy.hf_export import write_model_files
from nemo_opd.rollouts import RolloutResult, rollout_state
from nemo_opd.tiny.assets import recorded_heldout_accuracy
from nemo_opd.utils.export_folder import FINAL_MODEL_DIR, export_directory
from nemo_opd.utils.plot import ROLLOUTS_KEY, plot_metrics
from nemo_opd.utils.run_summary import RunOutcome, format_run_summary
from nemo_opd.utils.seeds import call_seed, request_seed
from nemo_opd.utils.startup import startup_metrics
from nemo_opd.utils.stop_signal import StopSignal, signal_name
from nemo_opd.utils.timers import Timers

ELAPSED_KEY = "progress/elapsed_s"


def run(cfg: DistillationConfig) -> int:
    """Set up, train, export; returns the exit status: 0, or 128 plus the signal's number (the
    shell's convention) when SIGTERM or SIGINT (Ctrl-C) stopped the run early, with a
    checkpoint to resume from and no final export: 143, 130. Bad input found at setup raises
    SetupError before any training."""
    state = setup(cfg)
    final_model = None
    try:
        finished = distillation_train(state)
        if finished:
            final_model = export_final_model(state)
    finally:
        state.shutdown()
    print(format_run_summary(_outcome(state, final_model)))
    return 0 if finished else 128 + state.stopped_by


def _outcome(state: DistillationRun, final_model: Path | None) -> RunOutcome:
    """What the end-of-run summary reports (utils/run_summary.py)."""
    accuracy = _recorded_teacher_accuracy(state.cfg)
    return RunOutcome(
        step=state.step,
        total_steps=state.cfg.distillation.max_num_steps,
        resumed_step=state.resumed_step,
        seconds=time.time() - state.started_at,
        log_dir=Path(state.cfg.logger.log_dir),
        final_model=final_model,
        teacher_accuracy=None if accuracy is None else (accuracy, "measured at its build"),
    )


# --------------------------------------------------------------------------------------- training


def distillation_train(state: DistillationRun) -> bool:
    """Run steps until max_num_steps or max_num_epochs (see the module docstring). Returns
    False when SIGTERM or SIGINT stopped it early (state.stopped_by: which): after the step in
    progress, with a checkpoint."""
    loop = state.cfg.distillation
    timers = Timers()
    if loop.val_at_start and state.step == 0:
        metrics = {**validate(state, timers), **timers.summary(), ROLLOUTS_KEY: 0}
        state.logger.log({**metrics, **_progress_metrics(state)}, step=0)
    pipeline = _start_pipeline(state)
    try:
        with StopSignal() as stop:
            finished = _train_steps(state, pipeline, timers, stop)
            state.stopped_by = None if finished else stop.received
            return finished
    finally:
        pipeline.stop()


def _start_pipeline(state: DistillationRun) -> StepPipeline:
    """The rollout producer, from the current step on (the checkpoint's saved rollouts that
    this run's schedule can use; the resumed weights published, for the engine to refit)."""
    keep_only_scheduled(state, state.saved_rollouts)
    if state.loader_position is None:
        state.loader_position = state.loader.state_dict()
    stale_engine = state.generation_version != state.step
    return StepPipeline(
        plan_steps(state),
        partial(produce_step, state),
        state.cfg.distillation.max_staleness,
        start_version=state.step,
        start_weights=_weights_ref(state) if stale_engine else None,
    )


def _train_steps(
    state: DistillationRun, pipeline: StepPipeline, timers: Timers, stop: StopSignal
) -> bool:
    """The steps, each on the producer's next scored rollouts; see distillation_train."""
    while True:
        try:
            trained = _train_next(state, pipeline, timers)
            if trained is None:
                return True
            plan, metrics, produced_seconds = trained
            step, last = plan.step, plan.last
            metrics.update(_validate_if_due(state, pipeline, timers, last))
        except ServiceError as error:
            raise _end_on_service_error(state, error, pipeline) from error
        metrics.update(_timing_metrics(timers, metrics["train/num_tokens"], produced_seconds))
        metrics.update(_progress_metrics(state))
        state.logger.log(metrics, step=step)
        state.last_metrics.update(metrics)
        stopping = stop.requested and not last
        if not last:  # before a save: the steps it waits for may sample from these weights
            _publish(state, pipeline, step)
        if state.checkpoints.should_save(step, is_last=last or stopping):
            _save_checkpoint(state, pipeline)
        if stopping:
            name = signal_name(stop.received)
            print(f"stopped after step {step} on {name}; run the same command to resume")
            return False
        if last:
            return True


def _train_next(
    state: DistillationRun, pipeline: StepPipeline, timers: Timers
) -> tuple[PlannedStep, dict, dict[str, float]] | None:
    """Steps 5-6 on the producer's next scored rollouts (None after the last step): the
    step's plan, its metrics and the producer's seconds per phase. The rollouts and the
    teacher's scores are released on return, before the producer makes a later step's: the
    driver holds only the steps in flight."""
    with timers.time("train"):
        with timers.time("rollout_wait"):
            produced = pipeline.next()
        if produced is None:
            return None
        metrics = _train_step(state, produced, timers)
    plan = produced.plan
    state.step = plan.step
    state.loader_position = plan.after
    metrics[ROLLOUTS_KEY] = plan.step * rollouts_per_step(state.cfg)
    return plan, metrics, produced.seconds


def _validate_if_due(
    state: DistillationRun, pipeline: StepPipeline, timers: Timers, last: bool
) -> dict:
    """Validation every val_period steps and after the last step with val_at_end, with the
    producer held (validation uses the generation engine and the teacher)."""
    loop, step = state.cfg.distillation, state.step
    if not ((loop.val_period and step % loop.val_period == 0) or (last and loop.val_at_end)):
        return {}
    with pipeline.held():
        return validate(state, timers)


def _publish(state: DistillationRun, pipeline: StepPipeline, step: int) -> None:
    """Tell the producer that the weights after `step` exist, with a handle on them when an
    on-policy step samples from them (step + 1 + max_staleness, or step + 1 when the refit
    check samples it fresh)."""
    cfg = state.cfg
    later = range(
        step + 1, min(step + 1 + cfg.distillation.max_staleness, cfg.distillation.max_num_steps) + 1
    )
    needed = any(is_on_policy_step(cfg, t) and scheduled_version(cfg, t) == step for t in later)
    pipeline.publish(step, _weights_ref(state) if needed else None)


def _end_on_service_error(
    state: DistillationRun, error: ServiceError, pipeline: StepPipeline
) -> RunError:
    """The error that ends a run whose outside service (a teacher server) failed. The run's
    own workers are intact, so the last completed step is checkpointed first (unless it is
    already), with the rollouts made ahead of it. The same command resumes from there."""
    if not state.cfg.checkpointing.enabled:
        return RunError(f"{error} (checkpointing is disabled: the run will start afresh)")
    if state.step == 0:
        return RunError(f"{error} (no step was completed: the run will start afresh)")
    if state.step not in state.checkpoints.checkpoints():
        _save_checkpoint(state, pipeline)
    directory = state.cfg.checkpointing.checkpoint_dir
    return RunError(f"{error} (step {state.step}, the last completed, is saved in {directory})")


def _progress_metrics(state: DistillationRun) -> dict:
    """progress/elapsed_s (seconds since the driver process started) and, the first time in a
    process, timing/startup/*."""
    metrics = {ELAPSED_KEY: time.time() - state.started_at}
    if state.startup:
        metrics.update(startup_metrics(state.started_at, state.startup))
        state.startup = {}
    return metrics


def _train_step(state: DistillationRun, produced: ProducedStep, timers: Timers) -> dict:
    """Steps 5-6 of the loop on one step's scored rollouts; returns its metrics."""
    cfg = state.cfg
    plan, rollout, batch = produced.plan, produced.rollout, produced.batch
    metrics = {}
    # 5. advantages
    if cfg.objective.loss == "policy_gradient":
        metrics.update(_policy_gradient_inputs(state, batch, rollout, len(plan.samples), timers))
    # The check compares vLLM with the weights that sampled: only on fresh rollouts.
    if is_checked_step(cfg, plan.step) and plan.on_policy and plan.version == plan.step - 1:
        with timers.time("logprob_check"):
            metrics["generation/logprob_mismatch"] = _logprob_mismatch(state, batch, rollout)
    # 6. train
    with timers.time("policy_training"):
        rows = (
            cfg.policy.train_global_batch_size
            * produced.copies
            // cfg.distillation.num_generations_per_prompt
        )
        history = state.student.train(batch, state.loss_fn, global_batch_size=rows)
    metrics.update(_train_metrics(history, batch, rollout))
    metrics.update(staleness_metrics(plan))
    if state.teacher is not None:
        metrics.update(_route_metrics(state.teacher.groups(rollout.metadata), rollout.rewards))
        metrics.update(produced.metrics)
    state.logger.log_rollouts(_rollout_records(rollout), step=plan.step)
    return metrics


def _route_metrics(groups: dict[str, torch.Tensor], rewards: torch.Tensor) -> dict:
    """teacher/<name>/samples (rows routed to it) and teacher/<name>/reward (their mean reward),
    with several teachers."""
    metrics = {}
    for name, rows in groups.items():
        metrics[f"teacher/{name}/samples"] = float(len(rows))
        metrics[f"teacher/{name}/reward"] = float(rewards[rows].mean())
    return metrics


def _policy_gradient_inputs(
    state: DistillationRun,
    batch: TensorBatch,
    rollout: RolloutResult,
    num_prompts: int,
    timers: Timers,
) -> dict:
    """Step 5: add old_logprobs (the student's, before this step's updates, at the sampling
    temperature), sampler_logprobs (vLLM's) and advantages ([B, S], position t scoring token
    t + 1) to the batch; returns the advantages' metrics as train/*."""
    cfg, objective = state.cfg, state.cfg.objective
    with timers.time("old_logprobs"):
        old = state.student.get_logprobs(batch, temperature=sampling_temperature(cfg))
    batch["old_logprobs"] = old
    batch["sampler_logprobs"] = _sampler_logprobs(rollout, old)
    with timers.time("advantages"):
        mask = build_loss_mask(batch["token_mask"], batch["sample_mask"])
        advantages, stats = compute_advantages(
            mask,
            rewards=rollout.rewards,
            group_ids=group_ids_for(num_prompts, cfg.distillation.num_generations_per_prompt),
            student_logprobs=old,
            teacher_logprobs=batch.get("teacher_logprobs"),
            opd_coef=objective.opd_coef,
            opd_discount=objective.opd_discount,
            reward_estimator=objective.reward_estimator if objective.uses_reward else "none",
            reward_coef=objective.reward_coef,
            normalize_std=objective.grpo_normalize_std,
        )
    batch["advantages"] = advantages
    return {f"train/{name}": value for name, value in stats.items()}


def _sampler_logprobs(rollout: RolloutResult, old: torch.Tensor) -> torch.Tensor:
    """vLLM's log-prob of every sampled token at the position that predicts it, [B, S]; where
    vLLM reported none (tokens it did not sample), the student's own (a correction weight
    of 1)."""
    generated, known = flatten_generation_logprobs(rollout.message_logs, old.shape[1])
    shifted = torch.roll(generated, -1, dims=1)
    known = torch.roll(known, -1, dims=1)
    known[:, -1] = 0
    return torch.where(known > 0, shifted, old)


def _timing_metrics(timers: Timers, num_tokens: float, produced: dict[str, float]) -> dict:
    """Seconds per phase ("timing/train/<phase>", the whole step as
    "timing/train/total_step_time": the loop's wall time, rollout_wait included) with the
    producer's phases for this step's rollouts ("timing/train/generation", ...), and trained
    tokens per second."""
    timings = timers.summary()
    total = timings.pop("timing/train")
    for name, seconds in produced.items():
        timings["timing/train/" + name.removeprefix("timing/")] = seconds
    timings["timing/train/total_step_time"] = total
    timings["train/tokens_per_sec"] = num_tokens / total
    return timings


def _refit_if_stale(state: DistillationRun) -> None:
    """Push the student's weights into vLLM when they changed since the last push."""
    version = state.step
    if version != state.generation_version:
        state.generation.refit(_weights_ref(state), version)
        state.generation_version = version


def _weights_ref(state: DistillationRun) -> Any:
    """What a refit reads: a handle on the student's gathered weights (Policy.full_weights_ref),
    or IN_PLACE where the engine generates from the student's own module (nothing to gather)."""
    if state.generation.shares_student:
        return IN_PLACE
    return state.student.full_weights_ref()


def _logprob_mismatch(state: DistillationRun, batch: TensorBatch, rollout: RolloutResult) -> float:
    """Mean |vLLM log-prob - student log-prob| over the generated tokens of this step's first
    generation.logprob_check_samples rollouts (all of them when null); a policy-gradient step
    reuses the old log-probs it already computed."""
    gen_cfg = state.cfg.policy.generation
    rows = min(batch.size, gen_cfg.logprob_check_samples or batch.size)
    checked = batch.slice(0, rows)
    if "old_logprobs" in checked:
        student = checked["old_logprobs"]
    else:
        student = state.student.get_logprobs(checked, temperature=sampling_temperature(state.cfg))
    generated, mask = flatten_generation_logprobs(
        rollout.message_logs[:rows], checked["input_ids"].shape[1]
    )
    # Position t of get_logprobs scores token t + 1.
    return logprob_mismatch(generated[:, 1:], student[:, :-1], mask[:, 1:])


def _train_metrics(history: dict, batch: TensorBatch, rollout: RolloutResult) -> dict:
    """train/* (loss-function metrics averaged over the step's optimizer steps; *_min / *_max:
    their min / max), rollout/*."""
    combine = {"min": min, "max": max, "sum": lambda values: sum(values) / len(values)}
    metrics = {
        f"train/{name}": combine[metric_reduction(name)](values) for name, values in history.items()
    }
    metrics["train/reward"] = float(rollout.rewards.mean())
    metrics["train/num_tokens"] = float(batch["input_lengths"].sum())
    metrics.update({f"rollout/{name}": value for name, value in rollout.metrics.items()})
    metrics.update(rollout.env_metrics)
    return metrics


def _rollout_records(rollout: RolloutResult) -> list[dict]:
    """JSON-friendly rollouts: the first prompt, the assistant turns (joined by " || "), the
    whole conversation, the reference answer, the reward and the weights version that sampled
    it (null off-policy)."""
    records = []
    for log, meta, reward, truncated in zip(
        rollout.message_logs, rollout.metadata, rollout.rewards, rollout.truncated, strict=True
    ):
        replies = [m["content"] for m in log if m["role"] == "assistant"]
        records.append(
            {
                "prompt": meta.get("prompt", ""),
                "response": " || ".join(replies),
                "answer": meta.get("answer"),
                "reward": float(reward),
                "truncated": bool(truncated),
                VERSION_KEY: meta.get(VERSION_KEY),
                "messages": [{"role": m["role"], "content": m["content"]} for m in log],
            }
        )
    return records


# ------------------------------------------------------------------------------------- validation


def validate(state: DistillationRun, timers: Timers, responses: list[dict] | None = None) -> dict:
    """Greedy rollouts of the validation prompts: accuracy (mean env reward), average generated
    length and, with a teacher, the top-k divergence between student and teacher on those
    rollouts; with distillation.val_samples_per_prompt = k, also avg@k and pass@k of k sampled
    rollouts per prompt. Every graded response is appended to `responses` when given (the
    records of the rollout dumps, with "mode": greedy or sampled, and "sample": 0..k-1)."""
    loop = state.cfg.distillation
    with timers.time("validation"):
        with timers.time("refit"):
            _refit_if_stale(state)
        metrics = _validate_greedy(state, timers, responses)
        if loop.val_samples_per_prompt:
            k = loop.val_samples_per_prompt
            metrics.update(_validate_sampled(state, timers, k, responses))
    return metrics


def _graded(rollout: RolloutResult, mode: str, samples: int) -> list[dict]:
    """The rollouts' records (_rollout_records) marked with how they were sampled."""
    records = _rollout_records(rollout)
    for index, record in enumerate(records):
        record.update(mode=mode, sample=index % samples)
    return records


def _validate_greedy(state: DistillationRun, timers: Timers, responses: list | None = None) -> dict:
    """validation/accuracy, avg_length and, with a teacher, the divergence metrics; with several
    teachers, each teacher's own as validation/teacher/<name>/* (its prompts' rollouts). The
    student's divergence on a chunk is evaluated while the next chunk generates where
    generation has devices of its own (student_evaluation)."""
    loop = state.cfg.distillation
    samples = state.val_prompts.samples
    rewards, graded, lengths = [], [], []
    env_metrics: dict[str, float] = defaultdict(float)
    # Not beside generation on the same module (a shared one): it switches its attention.
    background = not (state.generation.colocated or state.generation.shares_student)
    evaluation = StudentEvaluation(state, background=background)
    try:
        for start in range(0, len(samples), loop.val_batch_size):
            chunk = samples[start : start + loop.val_batch_size]
            logs, metadata = repeat_samples(chunk, 1)
            with timers.time("generation"):
                rollout = rollout_with(state, logs, metadata, greedy=True, seed=None)
            rewards.append(rollout.rewards)
            if responses is not None:
                responses += _graded(rollout, "greedy", 1)
            for name, value in rollout.env_metrics.items():
                env_metrics[f"validation/{name}"] += value
            lengths.append(rollout.metrics["mean_generated_tokens"] * len(chunk))
            graded += rollout.metadata
            if state.teacher is None:
                continue
            with timers.time("teacher_topk"):
                batch, _ = score_rollout(state, rollout, topk=True)
            evaluation.submit(batch, state.teacher.groups(rollout.metadata) or {"": None})
        divergence = {}
        if state.teacher is not None:
            with timers.time("student_eval_wait"):
                divergence, seconds = evaluation.finish()
            timers.add("student_eval", seconds)
    finally:
        evaluation.close()
    rewards = torch.cat(rewards)
    metrics = {
        "validation/accuracy": float(rewards.mean()),
        "validation/avg_length": sum(lengths) / len(samples),
        **divergence,
        **env_metrics,
    }
    groups = state.teacher.groups(graded) if state.teacher is not None else {}
    for name, rows in groups.items():
        metrics[f"validation/teacher/{name}/accuracy"] = float(rewards[rows].mean())
    return metrics


def _validate_sampled(
    state: DistillationRun, timers: Timers, k: int, responses: list | None = None
) -> dict:
    """validation/accuracy_avg@k (mean reward over k samples of every prompt at
    distillation.val_temperature) and validation/pass@k (the fraction of prompts with a
    reward-1 sample). Seeds depend only on (seed, prompt index), so every validation samples
    alike and a resumed run reproduces them."""
    loop = state.cfg.distillation
    samples = state.val_prompts.samples
    chunk_prompts = max(1, loop.val_batch_size // k)
    rewards = []
    for start in range(0, len(samples), chunk_prompts):
        logs, metadata = repeat_samples(samples[start : start + chunk_prompts], k)
        seed = request_seed(call_seed(loop.seed, "validation", 0), start * k, 0)
        with timers.time("generation"):
            rollout = rollout_with(
                state, logs, metadata, greedy=False, seed=seed, temperature=loop.val_temperature
            )
        rewards.append(rollout.rewards)
        if responses is not None:
            responses += _graded(rollout, "sampled", k)
    per_prompt = torch.cat(rewards).reshape(len(samples), k)
    return {
        f"validation/accuracy_avg@{k}": float(per_prompt.mean()),
        f"validation/pass@{k}": float((per_prompt >= 1).any(dim=1).float().mean()),
    }


# ------------------------------------------------------------------------------- save and export


def _save_checkpoint(state: DistillationRun, pipeline: StepPipeline) -> None:
    """An atomic checkpoint of the student, the loop position and, with max_staleness s > 0,
    the rollouts made ahead for steps step+1..step+s (sampled from weights the checkpoint
    does not hold; the producer finishes them first), ranked by the metric. A save that fails
    (a full disk, a file-size limit, a worker that died) ends the run with a RunError saying
    that the earlier checkpoints are intact."""
    ahead = state.cfg.distillation.max_staleness
    with pipeline.held(through=state.step + ahead):
        rollouts = pipeline.rollouts_after(state.step) if ahead else {}
        saved = {"loader": state.loader_position, ROLLOUTS_AHEAD_KEY: sorted(rollouts)}
        metrics = {k: v for k, v in state.last_metrics.items() if isinstance(v, int | float)}

        def write(directory: Path) -> None:
            state.student.save(str(Path(directory) / "policy"))
            if rollouts:
                ahead_states = {step: rollout_state(r) for step, r in rollouts.items()}
                torch.save(ahead_states, Path(directory) / ROLLOUTS_AHEAD_FILE)

        try:
            state.checkpoints.save(state.step, write, state=saved, metrics=metrics)
        except (OSError, RunError) as error:
            earlier = [step for step in state.checkpoints.checkpoints() if step < state.step]
            kept = f"step {max(earlier)}" if earlier else "none: the run will start afresh"
            raise RunError(
                f"saving the checkpoint of step {state.step} failed, and nothing of it was "
                f"kept: {error}. The earlier checkpoints are intact (newest: {kept}); free "
                "space or fix the cause, then run the same command again to resume"
            ) from error


def _recorded_teacher_accuracy(cfg: DistillationConfig) -> float | None:
    """The teacher's held-out accuracy when the run validates where its build measured it
    (a tiny teacher on tiny_math's held-out split); None otherwise."""
    data = cfg.data
    on_heldout = data.dataset_name == "tiny_math" and data.val_split in (None, "validation")
    has_model = "teacher" in cfg.named_teachers  # one teacher, a model of its own
    if not has_model or not on_heldout or data.val_path or data.val_dataset_name:
        return None
    return recorded_heldout_accuracy(cfg.teacher.model_name)


def export_final_model(state: DistillationRun) -> Path:
    """The trained student as a Hugging Face model (nemo_opd.policy.hf_export: weights in the
    policy's precision, config, tokenizer, chat template, generation_config.json; a LoRA
    student merged, with its peft adapter in final_model/adapter; no training state) under
    checkpointing.checkpoint_dir/final_model, written whole over the previous export (never
    over anything else: nemo_opd.utils.export_folder), and the PNG of the training curves."""
    target = Path(state.cfg.checkpointing.checkpoint_dir) / FINAL_MODEL_DIR
    source = {"checkpoint_dir": state.cfg.checkpointing.checkpoint_dir, "step": state.step}
    with export_directory(target, source, earlier_unmarked=True) as folder:
        state.student.export(str(folder), state.cfg.policy.precision)
        write_model_files(folder, state.formatter.tokenizer, state.cfg.policy)
    metrics_file = Path(state.cfg.logger.log_dir) / "metrics.jsonl"
    if metrics_file.exists():
        references = {}
        teacher = state.cfg.teacher
        has_model = teacher is not None and teacher.model_name is not None
        accuracy = recorded_heldout_accuracy(teacher.model_name) if has_model else None
        if accuracy is not None:
            references["validation/accuracy"] = ("teacher, at its build", accuracy)
        plot_metrics(
            metrics_file, Path(state.cfg.logger.log_dir) / "curves.png", references=references
        )
    print(f"final student: {target}")
    return target
