"""How a command prints the error that ends it: `error: <message>` on standard error, with
nothing secret in it (nemo_opd.secrets). On a terminal each line is wrapped at the terminal's
width; into a file (a log, CI) each problem stays one line, for grep."""

import sys

from nemo_opd.secrets import redact_text
from nemo_opd.utils.text_width import console_width, wrapped_lines


def print_error(error: BaseException | str) -> None:
    """Print `error` to standard error as `error: ...`, redacted and fitted (module
    docstring)."""
    text = f"error: {redact_text(str(error))}"
    if sys.stderr.isatty():
        text = wrapped_lines(text, console_width(sys.stderr))
    print(text, file=sys.stderr)
