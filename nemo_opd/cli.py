"""Command line of the example scripts: `--config FILE [overrides...] [--print-config]`.

Before anything starts (and with --print-config, after printing) the inputs the config names
are checked (algorithms/preflight.py): data files and their columns, prompt files, local model
and tokenizer folders.

Exit codes: 0 success; 2 a configuration error (the config file or an override) or a setup
error (data, tokenizers, models); 1 a fault that ended the run (a worker died, a checkpoint
could not be written); 143 a run stopped by SIGTERM at a clean point; 130 one stopped by SIGINT
(Ctrl-C): at a clean point (the step in progress finished and saved), or at once after a second
Ctrl-C or one outside the steps (set-up, validation at the start, the export), reported in one
line without a traceback. Errors are printed to stderr as `error: ...` without a traceback,
each line wrapped at a terminal's width (one line per problem into a file:
utils/error_output.py). Nothing printed holds a secret: URL user-info and registered secrets
are redacted (nemo_opd.secrets).
"""

import argparse
import os
import sys
from collections.abc import Sequence

from nemo_opd.algorithms.preflight import check_inputs
from nemo_opd.config import ConfigError, DistillationConfig, load_config, to_yaml
from nemo_opd.errors import RunError, SetupError
from nemo_opd.secrets import redact_text
from nemo_opd.utils.cpu_waits import prefer_passive_waits
from nemo_opd.utils.error_output import EXIT_INTERRUPTED, print_error, print_interrupted
from nemo_opd.utils.gc_pause import collection_paused
from nemo_opd.utils.import_ahead import ImportAhead
from nemo_opd.utils.text_width import wrapped
from nemo_opd.utils.wheel_tags import repair_installed_tags

EXIT_CONFIG_ERROR = 2
EXIT_RUN_FAILED = 1
INTERRUPTED = (
    "nothing since the run's last checkpoint is saved (the same command resumes from that "
    "checkpoint, if the run saved one)"
)
LOOP_HEAVY_IMPORTS = ("nemo_opd.algorithms.tokenizers", "nemo_opd.algorithms.model_checks")
"""Modules of the loop that import torch and transformers (most of its import time:
docs/benchmarks.md, "Where the embedded default's time goes") and not Ray."""


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The argument parser: a config file, overrides, and --print-config."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog="overrides: a.b=v (set), +a.b=v (add), ++a.b=v (set or add), ~a.b (delete)",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    parser.add_argument(
        "--print-config",
        action="store_true",
        help="print the resolved, validated config as YAML, check the data files and model "
        "folders it names, and exit",
    )
    parser.add_argument(
        "overrides", nargs="*", help="overrides in Hydra's grammar, e.g. loss_fn.kl_type=jsd"
    )
    return parser


def main(argv: Sequence[str] | None = None, description: str | None = None) -> int:
    """Parse the command line, load the config, then print it or run distillation."""
    prefer_passive_waits()  # before torch loads: idle CPU threads sleep (utils/cpu_waits.py)
    args = build_parser(description).parse_intermixed_args(argv)
    for line in repair_installed_tags():
        note = f"note: repaired installed wheel tags so that `uv run` stops reinstalling: {line}"
        print(wrapped(note), file=sys.stderr)
    try:
        cfg = load_config(args.config, args.overrides)
        if args.print_config:
            sys.stdout.write(redact_text(to_yaml(cfg)))
            sys.stdout.flush()
        check_inputs(cfg)  # files, columns, model folders: before any process starts
        return 0 if args.print_config else _train(cfg)
    except (ConfigError, SetupError) as error:
        print_error(error)
        return EXIT_CONFIG_ERROR
    except RunError as error:
        print_error(error)
        return EXIT_RUN_FAILED
    except KeyboardInterrupt:  # Ctrl-C outside the steps, or a second one within them
        print_interrupted(INTERRUPTED)
        return EXIT_INTERRUPTED


def _engine_modules(cfg: DistillationConfig) -> list[str]:
    """The engine modules of the student's and the teachers' backends: what their ranks import
    (nemo_opd.policy.engines.ENGINE_MODULES)."""
    from nemo_opd.policy.engines import ENGINE_MODULES

    models = [cfg.policy, *cfg.named_teachers.values()]
    return list(dict.fromkeys(ENGINE_MODULES[model.backend] for model in models))


def _train(cfg: DistillationConfig) -> int:
    """Hand the config to the distillation loop: without Ray when it runs in this process or in
    processes of this machine (the local and processes executors: Ray is never imported), else
    inside a Ray session (started here unless this process is connected to one, and stopped
    again afterwards if this call started it)."""
    from nemo_opd.config.executor import run_executor, uses_ray
    from nemo_opd.utils.run_dirs import with_absolute_paths
    from nemo_opd.utils.run_identity import check_run_folders

    # Another run's checkpoints or metrics are refused in seconds, before any worker starts.
    finished = check_run_folders(with_absolute_paths(cfg))
    if finished:
        print(wrapped(finished))
        return 0
    executor = run_executor(cfg)
    if executor == "processes":
        from nemo_opd.distributed.process_workers import start_fork_server

        start_fork_server(_engine_modules(cfg))  # its imports beside this process's own
    if not uses_ray(executor):
        with collection_paused():  # the loop's imports: torch, transformers (gc_pause)
            from nemo_opd.algorithms.distillation import run

        return run(cfg)
    # Read by Ray at import time: under `uv run`, Ray would otherwise build a fresh virtual
    # environment for every worker; the workers use this one as it is.
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    from nemo_opd.distributed.ray_runtime import ray_session

    # Ray's processes start while a thread imports torch and transformers (the loop's heaviest
    # imports), instead of after them. Imported here, not at the top: --print-config and
    # configuration errors never need Ray, vLLM or the engines.
    ahead = ImportAhead(LOOP_HEAVY_IMPORTS)
    with ray_session(cfg.cluster):
        ahead.join()
        with collection_paused():
            from nemo_opd.algorithms.distillation import run

        return run(cfg)
