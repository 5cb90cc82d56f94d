"""A step's scored rollouts: steps 1-4 of the loop (nemo_opd.algorithms.distillation), which
the rollout producer (rollout_pipeline.StepPipeline) runs for each planned step:

    1. refit     the generation engine to the step's weights version, when it holds another
    2. rollout   the student's samples (multi-turn, graded by the environments); or, on an
                 off-policy step, the dataset's or the teacher's responses
    3. flatten   message logs -> input_ids, input_lengths, token_mask, sample_mask
    4. teacher   what the objective uses of the teacher (teachers.base.Teacher.score)

With distillation.stream_chunks = n > 1 the prompts are generated in n parts (whole prompt
groups, in order; each row keeps the seeds it has in the whole batch, turn by turn) and each
part is scored by the teacher in a second thread while the next one generates, then placed
into the whole batch's tensors. Steps whose rollouts a checkpoint saved (resume with
max_staleness > 0) skip 1-2 and are scored in the same parts.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from nemo_opd.algorithms.data_mix import is_on_policy_step
from nemo_opd.algorithms.objective import sampling_temperature, teacher_temperature
from nemo_opd.algorithms.prompts import repeat_samples
from nemo_opd.algorithms.rollout_pipeline import (
    PlannedStep,
    ProducedStep,
    StepPipeline,
    version_for,
)
from nemo_opd.algorithms.run_state import DistillationRun
from nemo_opd.config import DistillationConfig
from nemo_opd.data.batching import TensorBatch
from nemo_opd.data.message_log import flatten_message_logs
from nemo_opd.generation import VllmGeneration
from nemo_opd.rollouts import RolloutResult, concat_rollouts, run_multi_turn_rollout
from nemo_opd.rollouts.off_policy import reference_rollout
from nemo_opd.scoring.base import Rollouts, TeacherNeed
from nemo_opd.utils.seeds import call_seed, request_seed
from nemo_opd.utils.timers import Timers

VERSION_KEY = "weights_version"
"""The metadata field of every on-policy sample: the weights version that sampled it."""


def plan_steps(state: DistillationRun) -> Iterator[PlannedStep]:
    """The run's remaining steps in order, drawing each step's prompts from state.loader; the
    last is max_num_steps or the last batch of the last allowed epoch."""
    cfg, loop = state.cfg, state.cfg.distillation
    batches = iter(state.loader)
    step = state.step
    while step < loop.max_num_steps and state.loader.next_epoch < loop.max_num_epochs:
        step += 1
        position = state.loader.state_dict()
        samples = next(batches)
        on_policy = is_on_policy_step(cfg, step)
        yield PlannedStep(
            step=step,
            samples=samples,
            last=step == loop.max_num_steps or state.loader.next_epoch >= loop.max_num_epochs,
            position=position,
            after=state.loader.state_dict(),
            on_policy=on_policy,
            version=_sampling_version(state, step) if on_policy else None,
        )


def checked_every(cfg: DistillationConfig) -> int | None:
    """policy.generation.logprob_check_period when the refit check is on (the steps it checks
    sample fresh: version_for's fresh_every), else None."""
    generation = cfg.policy.generation
    return generation.logprob_check_period if generation.logprob_check else None


def scheduled_version(cfg: DistillationConfig, step: int) -> int:
    """The weights version that samples on-policy step `step` in this run's schedule."""
    return version_for(step, cfg.distillation.max_staleness, checked_every(cfg))


def is_checked_step(cfg: DistillationConfig, step: int) -> bool:
    """The refit check runs on this step's rollouts if they come from the newest weights."""
    period = checked_every(cfg)
    return cfg.policy.generation.logprob_check and (period is None or (step - 1) % period == 0)


def _sampling_version(state: DistillationRun, step: int) -> int:
    """scheduled_version(step), or the resumed step's weights for a step whose scheduled
    (older) weights are gone and whose rollouts the checkpoint did not save."""
    version = scheduled_version(state.cfg, step)
    if version < state.resumed_step and step not in state.saved_rollouts:
        print(
            f"step {step}: its rollouts (from the weights of step {version}) were not saved "
            f"with the checkpoint; sampling them from step {state.resumed_step}'s weights"
        )
        return state.resumed_step
    return version


def produce_step(state: DistillationRun, pipeline: StepPipeline, plan: PlannedStep) -> ProducedStep:
    """Steps 1-4 for one planned step (see the module docstring). The rollouts are kept by
    the pipeline as soon as they exist, before the teacher's scores (for a checkpoint)."""
    timers = Timers()
    copies = _copies(state, plan.on_policy)
    parts = _parts(len(plan.samples), copies, state)
    rollout = state.saved_rollouts.pop(plan.step, None)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="teacher-scoring") as scorer:
        if rollout is None:
            if plan.on_policy:
                with timers.time("refit"):
                    _refit_to(state, pipeline, plan.version)
            with timers.time("generation"):
                rollout, futures = _generate(state, plan, copies, parts, scorer)
        else:
            futures = [scorer.submit(score_rollout, state, _rows(rollout, *p)) for p in parts]
        pipeline.keep(plan.step, rollout)
        scored = [future.result() for future in futures]
    batch, scoring = _placed(state, rollout, parts, scored) if len(parts) > 1 else scored[0]
    seconds = timers.summary()
    for phase, value in scoring.items():
        seconds[f"timing/{phase}"] = seconds.get(f"timing/{phase}", 0.0) + value
    metrics = state.teacher.take_metrics() if state.teacher is not None else {}
    return ProducedStep(plan, rollout, copies, batch, seconds, metrics)


def _refit_to(state: DistillationRun, pipeline: StepPipeline, version: int) -> None:
    """The generation engine holding the weights after `version` steps (a no-op when it
    does)."""
    if version != state.generation_version:
        state.generation.refit(pipeline.weights(version), version)
        state.generation_version = version


def _copies(state: DistillationRun, on_policy: bool) -> int:
    """Conversations per prompt: num_generations_per_prompt, or the dataset's responses each
    once (_reference_copies) on an off-policy step without a teacher sampler."""
    if not on_policy and state.teacher_sampler is None:
        return _reference_copies(state)
    return state.cfg.distillation.num_generations_per_prompt


def _reference_copies(state: DistillationRun) -> int:
    """Rows per prompt on a step that trains on the dataset's responses: one, trained with a
    global batch num_generations_per_prompt times smaller, so every optimizer step sees the
    same prompts with the same weights as g identical copies would give it (the loss is
    normalized by the step's tokens), at 1/g of the teacher's and the trainer's work. g copies
    when the global batch does not divide so (by g, then by the data-parallel size)."""
    g = state.cfg.distillation.num_generations_per_prompt
    rows = state.cfg.policy.train_global_batch_size
    return 1 if rows % g == 0 and (rows // g) % state.student.dims.dp == 0 else g


def _parts(num_prompts: int, copies: int, state: DistillationRun) -> list[tuple[int, int]]:
    """Row ranges [start, end) of the stream_chunks parts: whole prompt groups, contiguous,
    their sizes differing by at most one prompt."""
    chunks = min(state.cfg.distillation.stream_chunks, num_prompts)
    base, extra = divmod(num_prompts, chunks)
    bounds, start = [], 0
    for part in range(chunks):
        end = start + base + (part < extra)
        bounds.append((start * copies, end * copies))
        start = end
    return bounds


def _generate(
    state: DistillationRun,
    plan: PlannedStep,
    copies: int,
    parts: list[tuple[int, int]],
    scorer: ThreadPoolExecutor,
) -> tuple[RolloutResult, list[Future]]:
    """Step 2, part after part, each part's scoring (step 4) submitted to `scorer` as soon as
    it exists; the whole rollout and the scoring futures, in part order."""
    logs, metadata = repeat_samples(plan.samples, copies)
    rollouts, futures = [], []
    for start, end in parts:
        part = _step_rollout(state, logs[start:end], metadata[start:end], plan, start)
        rollouts.append(part)
        futures.append(scorer.submit(score_rollout, state, part))
    rollout = rollouts[0] if len(rollouts) == 1 else concat_rollouts(rollouts)
    return rollout, futures


def _rows(rollout: RolloutResult, start: int, end: int) -> RolloutResult:
    """Rows [start, end) of a rollout (what scoring reads: the logs and the metadata)."""
    return RolloutResult(
        message_logs=rollout.message_logs[start:end],
        rewards=rollout.rewards[start:end],
        truncated=rollout.truncated[start:end],
        metadata=rollout.metadata[start:end],
    )


def _placed(
    state: DistillationRun,
    rollout: RolloutResult,
    parts: list[tuple[int, int]],
    scored: list[tuple[TensorBatch, dict[str, float]]],
) -> tuple[TensorBatch, dict[str, float]]:
    """The whole rollout flattened, with each part's teacher tensors ([b, S_p, ...]) placed
    at its rows and first S_p positions (zeros beyond them: padding, masked out)."""
    batch = flatten_message_logs(rollout.message_logs, state.formatter.tokenizer.pad_token_id)
    size, length = batch["input_ids"].shape
    seconds: dict[str, float] = {}
    for (start, end), (part, part_seconds) in zip(parts, scored, strict=True):
        for key in [k for k in part if k.startswith("teacher_")]:
            values = part[key]
            if key not in batch:
                batch[key] = values.new_zeros((size, length, *values.shape[2:]))
            batch[key][start:end, : values.shape[1]] = values
        for phase, value in part_seconds.items():
            seconds[phase] = seconds.get(phase, 0.0) + value
    return batch, seconds


def score_rollout(
    state: DistillationRun, rollout: RolloutResult, *, topk: bool | None = None
) -> tuple[TensorBatch, dict[str, float]]:
    """Steps 3-4: the rollouts flattened into a batch (input_ids, input_lengths, token_mask,
    sample_mask) with, as the objective asks (or top-k alone, topk=True: validation), the
    teacher's top-k log-probs and ids of every position (teacher_topk_logprobs,
    teacher_topk_indices [B, S, k]) and its log-prob of every sampled token
    (teacher_logprobs [B, S], position t scoring token t + 1), both possibly 0 where token
    t + 1 is not trained (TeacherNeed.trained_only), or with loss_fn.support full
    or student_topk its final hidden states instead of its top-k (teacher_hidden
    [B, S, H_T]), all from one call of the teacher; and that call's seconds, named by what it
    computed (teacher_phase: "teacher_topk", "teacher_topk_logprobs", ...)."""
    cfg, objective = state.cfg, state.cfg.objective
    sampled = objective.uses_sampled_teacher and topk is None
    topk = objective.uses_topk if topk is None else topk
    batch = flatten_message_logs(rollout.message_logs, state.formatter.tokenizer.pad_token_id)
    rollouts = Rollouts(batch, rollout.message_logs, rollout.metadata)
    temperature = teacher_temperature(cfg)
    seconds = {}
    hidden = topk and cfg.loss_fn.support != "teacher_topk"
    need = TeacherNeed(
        topk=cfg.distillation.topk_logits_k if topk and not hidden else 0,
        sampled=sampled,
        temperature=temperature,
        hidden=hidden,
        trained_only=True,  # every loss and metric reads the loss mask's positions only
    )
    if need.topk or need.sampled or need.hidden:
        started = time.perf_counter()
        scores = state.teacher.score(rollouts, need)
        fields = {
            "teacher_topk_logprobs": scores.topk_logprobs,
            "teacher_topk_indices": scores.topk_indices,
            "teacher_hidden": scores.hidden_states,
            "teacher_logprobs": scores.logprobs,
        }
        batch.update({name: value for name, value in fields.items() if value is not None})
        seconds[teacher_phase(need)] = time.perf_counter() - started
    return batch, seconds


def teacher_phase(need: TeacherNeed) -> str:
    """The timing phase of one teacher call: "teacher_" and what it computed, in the order
    topk, hidden, logprobs ("teacher_topk", "teacher_hidden_logprobs", ...)."""
    asked = {"topk": need.topk, "hidden": need.hidden, "logprobs": need.sampled}
    return "teacher_" + "_".join(name for name, wanted in asked.items() if wanted)


def _step_rollout(
    state: DistillationRun, logs: list, metadata: list, plan: PlannedStep, first_row: int = 0
) -> RolloutResult:
    """Step 2 for rows first_row.. of the step: sampled by the student (on-policy, each
    sample's metadata recording plan.version) or by the teacher (seq_kd, at the generation
    temperature, as TRL's GKD); or the dataset's responses. rollout/on_policy and
    rollout/teacher_sampled say which."""
    cfg = state.cfg
    sampler = state.teacher_sampler
    seed = request_seed(step_seed(cfg, plan.step), first_row, 0)  # the part's first row
    if plan.on_policy:
        rollout = rollout_with(state, logs, metadata, greedy=False, seed=seed)
        for meta in rollout.metadata:
            meta[VERSION_KEY] = plan.version
    elif sampler is not None:
        temperature = sampling_temperature(cfg)
        rollout = rollout_with(
            state, logs, metadata, greedy=False, seed=seed, temperature=temperature, engine=sampler
        )
    else:
        max_len = cfg.policy.max_total_sequence_length
        rollout = reference_rollout(logs, metadata, state.formatter, state.environments, max_len)
    rollout.metrics["on_policy"] = float(plan.on_policy)
    rollout.metrics["teacher_sampled"] = float(not plan.on_policy and sampler is not None)
    return rollout


def rollout_with(
    state: DistillationRun,
    logs: list,
    metadata: list,
    *,
    greedy: bool,
    seed: int | None,
    temperature: float | None = None,
    engine: VllmGeneration | None = None,
) -> RolloutResult:
    """Rollouts with the generation engine (the student's, or `engine`) awake (and asleep again
    afterwards)."""
    cfg = state.cfg
    engine = engine or state.generation
    engine.prepare_for_generation()
    try:
        return run_multi_turn_rollout(
            engine,
            logs,
            metadata,
            state.formatter,
            state.environments,
            max_seq_len=cfg.policy.max_total_sequence_length,
            max_rollout_turns=cfg.distillation.max_rollout_turns,
            max_new_tokens=cfg.policy.generation.max_new_tokens,
            greedy=greedy,
            seed=seed,
            temperature=temperature,
        )
    finally:
        engine.finish_generation()


def step_seed(cfg: DistillationConfig, step: int) -> int:
    """Sampling seed of a step: a hash of (seed, step) only, so resumed runs sample the same
    rollouts as uninterrupted ones, and no request of one step shares a seed with another's
    at any batch size. Row r of the step (prompt p's sample j: r = p x copies + j) at turn t
    samples with request_seed(step_seed, r, t) (nemo_opd.utils.seeds), whatever
    stream_chunks is."""
    return call_seed(cfg.distillation.seed, "step", step)


def staleness_metrics(plan: PlannedStep) -> dict[str, float]:
    """rollout/staleness (mean over the step's samples) and rollout/staleness_max: how many
    steps older than the weights being trained the sampling weights were (0 off-policy), and
    rollout/weights_version."""
    if plan.version is None:
        return {"rollout/staleness": 0.0, "rollout/staleness_max": 0.0}
    age = float(plan.step - 1 - plan.version)
    return {
        "rollout/staleness": age,
        "rollout/staleness_max": age,
        "rollout/weights_version": float(plan.version),
    }


def keep_only_scheduled(state: DistillationRun, saved: dict[int, RolloutResult]) -> None:
    """state.saved_rollouts: the checkpoint's rollouts whose weights version is the one this
    run's schedule gives their step (max_staleness may have changed since); a note for the
    others, which are sampled again."""
    s = state.cfg.distillation.max_staleness
    kept = {}
    for step, rollout in saved.items():
        versions = {meta.get(VERSION_KEY) for meta in rollout.metadata}
        expected = (
            scheduled_version(state.cfg, step) if is_on_policy_step(state.cfg, step) else None
        )
        if versions == {expected}:
            kept[step] = rollout
        else:
            found = ", ".join(sorted(str(v) for v in versions))
            print(
                f"step {step}: the checkpoint's rollouts were sampled from the weights of step "
                f"{found}, not {expected} as distillation.max_staleness={s} schedules; "
                "sampling them again"
            )
    state.saved_rollouts = kept
