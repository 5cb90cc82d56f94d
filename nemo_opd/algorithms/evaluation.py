"""Evaluation without training: a model or a checkpoint, validated as a run validates.

    cfg = evaluation_config(load_config(path), model_dir, out_dir, samples=4, temperature=0.6)
    metrics, graded = evaluate_model(cfg)

The run's own config is read for everything but the weights: the validation set
(data.val_* and distillation.max_val_samples), the prompt template, the chat template, the
environment, the teacher. What changes (evaluation_config): the student's weights are the
model folder's (model_folder: a Hugging Face model, sharded or not, an export, a checkpoint's
policy folder, or a hub model in the local cache), nothing is trained, resumed, checkpointed or
logged as a step. Then one validation
(distillation.validate): greedy accuracy, avg@k and pass@k of k samples per prompt at the
given temperature, the average length, and with a teacher the top-k divergences between the
student and the teacher on the greedy responses (validation/forward_kl, reverse_kl, ...).
"""

from pathlib import Path

from nemo_opd.algorithms.model_checks import WEIGHT_FILES
from nemo_opd.config import DistillationConfig
from nemo_opd.errors import SetupError
from nemo_opd.policy.hf_export import checkpoint_weights_dir

STEP_PREFIX = "step_"


def model_folder(given: str | Path) -> Path:
    """The weights to evaluate, as the engines load them: a Hugging Face model folder (one
    model.safetensors, or shards behind their index), an exported model, a checkpoint (step_N
    or its policy folder), a checkpoint directory (its newest step_N, said so), or a hub name
    whose model is in the local Hugging Face cache (its snapshot folder; nothing is
    downloaded). SetupError, naming what was looked for, when none is there."""
    path = Path(given).expanduser()
    if not path.exists() and (path.is_absolute() or str(given).startswith((".", "~"))):
        raise SetupError(f"--checkpoint {given}: no such folder")
    if not path.exists():  # "owner/name": a hub name, or a mistyped relative path
        return _cached_hub_model(str(given))
    if path.is_dir() and not (path / "config.json").exists() and not (path / "policy").is_dir():
        steps = [p for p in path.glob(f"{STEP_PREFIX}*") if p.name[len(STEP_PREFIX) :].isdigit()]
        if steps:
            newest = max(steps, key=lambda p: int(p.name[len(STEP_PREFIX) :]))
            print(f"evaluating the newest checkpoint of {path}: {newest.name}")
            path = newest
    if (path / "config.json").is_file() and any(
        (path / name).is_file() for name in WEIGHT_FILES["dtensor"]
    ):
        return path  # a Hugging Face model folder (an export among them), sharded or not
    return checkpoint_weights_dir(path)


def _cached_hub_model(name: str) -> Path:
    """The snapshot folder of hub model `name` in the local Hugging Face cache; SetupError
    when `name` is no folder here and no cached model (a download is left to the user, so
    that a mistyped local path never reaches the network)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        folder = Path(snapshot_download(name, local_files_only=True))
    except (HFValidationError, LocalEntryNotFoundError, OSError, ValueError):
        raise SetupError(
            f"--checkpoint {name}: no such folder, and no model of that name in the local "
            f"Hugging Face cache ({constants.HF_HUB_CACHE}); give the folder of a model or "
            f"checkpoint, or download the model first (hf download {name})"
        ) from None
    print(f"evaluating {name} from the Hugging Face cache: {folder}")
    return folder


def evaluation_config(
    cfg: DistillationConfig, weights: Path, out_dir: Path, samples: int, temperature: float
) -> DistillationConfig:
    """The run's config evaluating `weights`: the student loaded from that folder (a LoRA
    student's export is merged, so no adapters), no checkpoints (the output folder holds the
    run's lock and is the evaluation's own: resume force, so an earlier evaluation there is
    no other run's), no metric logs (evaluate writes metrics.json; an evaluation has no
    steps), `samples` sampled responses per prompt at `temperature` beside the greedy one
    (0: greedy only)."""
    policy = cfg.policy.model_copy(
        update={
            "model_name": str(weights.resolve()),
            "lora": cfg.policy.lora.model_copy(update={"enabled": False}),
        }
    )
    out = str(out_dir.resolve())
    logger = cfg.logger.model_copy(
        update={
            "log_dir": out,
            "jsonl_enabled": False,
            "tensorboard_enabled": False,
            "wandb_enabled": False,
            "console_progress": False,
        }
    )
    checkpointing = cfg.checkpointing.model_copy(
        update={"enabled": False, "checkpoint_dir": out, "resume": "force"}
    )
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
    returns the metrics and every graded response (nothing is logged as a step: evaluate
    prints and writes them). Under Ray, needs a Ray session (the command line starts one); in
    one process (the local executor), nothing more."""
    from nemo_opd.algorithms.distillation import validate
    from nemo_opd.algorithms.setup import setup
    from nemo_opd.utils.timers import Timers

    state = setup(cfg)
    try:
        graded: list[dict] = []
        timers = Timers()
        metrics = validate(state, timers, graded)
        metrics.update(timers.summary())
    finally:
        state.shutdown()
    return metrics, graded
