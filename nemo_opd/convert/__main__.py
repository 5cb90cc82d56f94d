"""python -m nemo_opd.convert nemo-rl CONFIG.yaml -o OUT.yaml
python -m nemo_opd.convert key-map     (the key map as docs/nemo_rl.md's Markdown table)

Reads a NeMo-RL distillation config (with its `defaults:`), writes nemo_opd's equivalent, prints
what every NeMo-RL key became (mapped as is, renamed, changed meaning, no equivalent with why),
then loads the written config as a run would. Exit status: 0 when it loads; 2 when the NeMo-RL
config cannot be read, or the written config does not load yet (the message says what to set,
for example a dataset NeMo-RL names by a registry name this project does not know).
docs/nemo_rl.md has the key map and what behaves differently.
"""

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from nemo_opd.config import ConfigError, load_config
from nemo_opd.config.loader import StrictDumper
from nemo_opd.convert.nemo_rl import Conversion, convert_nemo_rl
from nemo_opd.convert.report import format_report, markdown_key_map
from nemo_opd.secrets import redact_text
from nemo_opd.utils.error_output import print_error

EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_opd.convert",
        description="Convert another framework's config into nemo_opd's.",
    )
    frameworks = parser.add_subparsers(dest="framework", required=True, metavar="FRAMEWORK")
    nemo_rl = frameworks.add_parser(
        "nemo-rl", help="a NeMo-RL distillation config (examples/configs/distillation_*.yaml)"
    )
    nemo_rl.add_argument("config", metavar="CONFIG.yaml", help="the NeMo-RL config")
    nemo_rl.add_argument(
        "-o", "--output", required=True, metavar="OUT.yaml", help="where to write nemo_opd's"
    )
    frameworks.add_parser("key-map", help="print NeMo-RL's key map (docs/nemo_rl.md's table)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Convert, write, print the table, check that the output loads; the exit status."""
    args = build_parser().parse_args(argv)
    if args.framework == "key-map":
        print(markdown_key_map(), end="")
        return 0
    source, output = Path(args.config), Path(args.output)
    try:
        if output.resolve() == source.resolve():
            raise ConfigError(f"-o {output} is the NeMo-RL config itself; name another file")
        conversion = convert_nemo_rl(source)
        write_config(conversion, output)
    except (ConfigError, OSError) as error:
        print_error(error)
        return EXIT_BAD_INPUT
    print(f"NeMo-RL config {source} -> {output}\n")
    print(format_report(conversion.rows))
    return check_loads(output)


def write_config(conversion: Conversion, output: Path) -> None:
    """The converted config as YAML, headed by where it came from."""
    header = (
        f"# Converted from NeMo-RL's {conversion.source} by python -m nemo_opd.convert nemo-rl.\n"
        "# What each NeMo-RL key became, and what behaves differently: docs/nemo_rl.md.\n"
    )
    body = yaml.dump(
        conversion.config,
        Dumper=StrictDumper,
        sort_keys=False,
        default_flow_style=False,
        width=4096,
        allow_unicode=True,
    )
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(header + body, encoding="utf-8")


def check_loads(output: Path) -> int:
    """Load the written config as a run would; 0 when it loads, else the problems and 2."""
    try:
        load_config(output)
    except ConfigError as error:
        print(
            f"error: {output} was written but does not load yet; set these (in the file, or as "
            f"overrides):\n{redact_text(str(error))}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    print(
        f"{output} loads. Check it with: python examples/run_distillation_math.py --config "
        f"{output} --print-config"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
