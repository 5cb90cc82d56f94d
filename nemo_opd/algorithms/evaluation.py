"""Evaluation without training: a checkpoint or an exported model, validated as a run validates.

    cfg = evaluation_config(load_config(path), model_dir, out_dir, samples=4, temperature=0.6)
    metrics, graded = evaluate_model(cfg)

The run's own config is read for everything but the weights: the validation set
(data.val_* and distillation.max_val_samples), the prompt template, the chat template, the
environment, the teacher. What changes (evaluation_config): the student's weights are the
model folder's (a checkpoint's policy folder, or an exported model), nothing is trained,
resumed or checkpointed, and the logs go to the output folder. Then one validation
(distillation.validate): greedy accuracy, avg@k and pass@k of k samples per prompt at the
given temperature, the average length, and with a teacher the top-k divergences between the
student and the teacher on the greedy responses (validation/forward_kl, reverse_kl, ...).
"""

from pathlib import Path

from nemo_opd.config import DistillationConfig
from nemo_opd.errors import SetupError
from nemo_opd.utils.hf_export import checkpoint_weights_dir

STEP_PREFIX = "step_"


def model_folder(path: Path) -> Path:
    """The weights to evaluate: an exported model, a checkpoint (step_N or its policy folder),
    or a checkpoint directory (its newest step_N, said so). SetupError when none is there."""
    if path.is_dir() and not (path / "config.json").exists() and not (path / "policy").is_dir():
        steps = [p for p in path.glob(f"{STEP_PREFIX}*") if p.name[len(STEP_PREFIX) :].isdigit()]
        if steps:
            newest = max(steps, key=lambda p: int(p.name[len(STEP_PREFIX) :]))
            print(f"evaluating the newest checkpoint of {path}: {newest.name}")
            path = newest
    if not path.exists():
        raise SetupError(f"--checkpoint {path}: no such folder")
    return checkpoint_weights_dir(path)


def evaluation_config(
    cfg: DistillationConfig, weights: Path, out_dir: Path, samples: int, temperature: float
) -> DistillationConfig:
    """The run's config evaluating `weights`: the student loaded from that folder (a LoRA
    student's export is merged, so no adapters), no checkpoints (the output folder holds the
    run's lock), logs in `out_dir` (JSONL only), `samples` sampled responses per prompt at
    `temperature` beside the greedy one."""
    policy = cfg.policy.model_copy(
        update={
            "model_name": str(weights.resolve()),
            "lora": cfg.policy.lora.model_copy(update={"enabled": False}),
        }
    )
    out = str(out_dir.resolve())
    logger = cfg.logger.model_copy(
        update={"log_dir": out, "tensorboard_enabled": False, "wandb_enabled": False}
    )
    checkpointing = cfg.checkpointing.model_copy(update={"enabled": False, "checkpoint_dir": out})
    loop = cfg.distillation.model_copy(
        update={"val_samples_per_prompt": samples, "val_temperature": temperature}
    )
    return cfg.model_copy(
        update={
            "policy": policy,
            "logger": logger,
            "checkpointing": checkpointing,
            "distillation": loop,
        }
    )


def evaluate_model(cfg: DistillationConfig) -> tuple[dict, list[dict]]:
    """Set the run up (setup: its checks, workers and engines), validate once, shut it down;
    returns the metrics and every graded response. Under Ray, needs a Ray session (the
    command line starts one); in one process (the local executor), nothing more."""
    from nemo_opd.algorithms.distillation import validate
    from nemo_opd.algorithms.setup import setup
    from nemo_opd.utils.timers import Timers

    state = setup(cfg)
    try:
        graded: list[dict] = []
        timers = Timers()
        metrics = validate(state, timers, graded)
        metrics.update(timers.summary())
        state.logger.log(metrics, step=0)
    finally:
        state.shutdown()
    return metrics, graded
