"""python -m nemo_opd.export --config FILE --checkpoint DIR -o OUT [overrides...]

Exports a checkpoint's student as the run exports its final model (nemo_opd.policy.hf_export):
Hugging Face weights in policy.precision, config, tokenizer, chat template and
generation_config.json, and none of the training state. DIR is a checkpoint (step_N) or its
policy folder; the config is the run's (its tokenizer, chat template and precision). Runs on
the driver alone (no Ray, no GPU): the checkpoint's weights are read from disk. OUT is written
whole, and only when it is new, empty or an earlier export (nemo_opd.utils.export_folder).
Exit status 0, or 2 with one `error:` line for a bad config, a folder that holds no model, a
LoRA checkpoint (its adapters only: the run's final_model is the merged one), or an OUT that
holds anything else (nothing in it is touched); 130, in one line, when Ctrl-C stopped it.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from nemo_opd.config import ConfigError, load_config
from nemo_opd.errors import SetupError
from nemo_opd.utils.error_output import EXIT_INTERRUPTED, print_error, print_interrupted

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_opd.export",
        description="Export a checkpoint's student as a Hugging Face model.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="the run's YAML config")
    parser.add_argument(
        "--checkpoint", required=True, metavar="DIR", help="a checkpoint (step_N) of the run"
    )
    parser.add_argument("-o", "--output", required=True, metavar="OUT", help="the model folder")
    parser.add_argument("overrides", nargs="*", help="overrides, e.g. policy.precision=float32")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        # Heavy imports (torch, transformers) after the config is known to be good.
        from nemo_opd.algorithms.tokenizers import load_tokenizer
        from nemo_opd.policy.hf_export import export_checkpoint
        from nemo_opd.tiny.assets import resolve_pretrained

        policy = cfg.policy.with_names(resolve_pretrained)  # "tiny:*" to their local folders
        tokenizer = load_tokenizer(policy.tokenizer, "policy")
        target = export_checkpoint(Path(args.checkpoint), Path(args.output), tokenizer, policy)
    except (ConfigError, SetupError) as error:
        print_error(error)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print_interrupted()
        return EXIT_INTERRUPTED
    print(f"exported {args.checkpoint} as a Hugging Face model ({policy.precision}): {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
