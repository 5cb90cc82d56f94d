"""python -m nemo_opd.evaluate --config FILE --checkpoint MODEL [--samples K] [--temperature T]
[--output-dir OUT] [overrides...]

Evaluates a model on the run's validation set, without training
(nemo_opd.algorithms.evaluation): MODEL is a checkpoint (step_N, its policy folder, or a
checkpoint directory: its newest step), an exported model (final_model, python -m
nemo_opd.export's output), any Hugging Face model folder (one model.safetensors, or shards
behind their index), or a hub name whose model is in the local Hugging Face cache. As the run
validates: the greedy accuracy and average length of one greedy response per prompt, and the
teacher's top-k divergences when a teacher is configured; with K sampled responses per prompt
at temperature T (--samples, default the config's distillation.val_samples_per_prompt, 0:
none; --temperature, default distillation.val_temperature) also avg@K and pass@K. Writes into
OUT (default <logger.log_dir>/evaluation/<model folder's name>):
    graded.jsonl    every graded response: prompt, response, answer, reward, mode (greedy or
                    sampled), sample (0..K-1), truncated, messages
    metrics.json    the metrics (also printed)

Exit status: 0 when the evaluation ran; 2 for a bad config, override, folder or setup input; 1
for a fault that stopped it (a worker that died); 130 when Ctrl-C stopped it (one line, nothing
written).
"""

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from nemo_opd.config import ConfigError, load_config
from nemo_opd.errors import RunError, SetupError
from nemo_opd.utils.cpu_waits import prefer_passive_waits
from nemo_opd.utils.error_output import EXIT_INTERRUPTED, print_error, print_interrupted

EXIT_BAD_INPUT = 2
EXIT_RUN_FAILED = 1
GRADED_FILE = "graded.jsonl"
METRICS_FILE = "metrics.json"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_opd.evaluate",
        description="Evaluate a checkpoint or an exported model on the validation set.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the run's YAML config")
    parser.add_argument(
        "--checkpoint",
        required=True,
        metavar="MODEL",
        help="a checkpoint (step_N), a checkpoint directory (its newest), an exported or any "
        "Hugging Face model folder, or a hub name in the local cache",
    )
    parser.add_argument(
        "--samples",
        type=int,
        metavar="K",
        help="sampled responses per prompt beside the greedy one (avg@K, pass@K)",
    )
    parser.add_argument("--temperature", type=float, metavar="T", help="their temperature")
    parser.add_argument("--output-dir", metavar="OUT", help="where graded.jsonl goes")
    parser.add_argument(
        "overrides", nargs="*", help="overrides, e.g. distillation.max_val_samples=64"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    prefer_passive_waits()  # before torch loads: idle CPU threads sleep (utils/cpu_waits.py)
    args = build_parser().parse_intermixed_args(argv)
    try:
        cfg, out_dir = _evaluation_config(args)
        metrics, graded = _evaluate(cfg)
    except (ConfigError, SetupError) as error:
        print_error(error)
        return EXIT_BAD_INPUT
    except RunError as error:
        print_error(error)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:
        print_interrupted("nothing was written")
        return EXIT_INTERRUPTED
    _write(out_dir, metrics, graded)
    _print(metrics, out_dir, graded)
    return 0


def _evaluation_config(args: argparse.Namespace):
    """The run's config turned into the evaluation's, and the output folder."""
    from nemo_opd.algorithms.evaluation import evaluation_config, model_folder

    cfg = load_config(args.config, args.overrides)
    if args.samples is not None and not 0 <= args.samples <= 1024:
        raise ConfigError(f"--samples {args.samples}: must be from 0 to 1024")
    if args.temperature is not None and not 0 < args.temperature <= 100:
        raise ConfigError(f"--temperature {args.temperature}: must be above 0 and at most 100")
    weights = model_folder(args.checkpoint)
    given = Path(args.checkpoint).expanduser()
    name = given.resolve().name if given.exists() else given.name  # a hub name: its last part
    out_dir = Path(args.output_dir or Path(cfg.logger.log_dir) / "evaluation" / name)
    samples = cfg.distillation.val_samples_per_prompt if args.samples is None else args.samples
    temperature = args.temperature or cfg.distillation.val_temperature
    print(f"evaluating {weights}: {_decoding(samples, temperature)}")
    return evaluation_config(cfg, weights, out_dir, samples, temperature), out_dir


def _decoding(samples: int, temperature: float) -> str:
    """How each prompt is answered, in words."""
    if samples == 0:
        return "one greedy response per prompt, as the run validates (--samples K adds K sampled)"
    noun = "sample" if samples == 1 else "samples"
    return f"one greedy response and {samples} {noun} at T={temperature} per prompt"


def _evaluate(cfg) -> tuple[dict, list[dict]]:
    """evaluate_model without Ray (the local and processes executors), or inside a Ray session
    (started here unless one is connected)."""
    from nemo_opd.algorithms.evaluation import evaluate_model
    from nemo_opd.config.executor import run_executor, uses_ray

    if not uses_ray(run_executor(cfg)):
        return evaluate_model(cfg)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")  # see nemo_opd.cli
    from nemo_opd.distributed.ray_runtime import ray_session

    with ray_session(cfg.cluster):
        return evaluate_model(cfg)


def _write(out_dir: Path, metrics: dict, graded: list[dict]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / GRADED_FILE, "w", encoding="utf-8") as handle:
        for record in graded:
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    (out_dir / METRICS_FILE).write_text(json.dumps(metrics, indent=2, sort_keys=True))


def _print(metrics: dict, out_dir: Path, graded: list[dict]) -> None:
    """The validation metrics, then what was graded: prompts, and responses of each mode."""
    shown = {k: v for k, v in metrics.items() if k.startswith("validation/")}
    width = max(map(len, shown), default=0)
    for name in sorted(shown):
        print(f"  {name:<{width}}  {shown[name]:.4f}")
    prompts = sum(1 for record in graded if record.get("mode") == "greedy")
    sampled = (len(graded) - prompts) // max(prompts, 1)
    each = f"each one greedy and {sampled} sampled" if sampled else "one greedy response each"
    print(f"{prompts} prompts, {each}: {len(graded)} graded responses in {out_dir / GRADED_FILE}")


if __name__ == "__main__":
    sys.exit(main())
