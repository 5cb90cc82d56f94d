"""How a command prints the error that ends it: `error: <message>` on standard error, with
nothing secret in it (nemo_opd.secrets), and how it reports Ctrl-C (SIGINT), which it ends
with EXIT_INTERRUPTED instead of a traceback. On a terminal each line is wrapped at the
terminal's width; into a file (a log, CI) each problem stays one line, for grep."""

import sys

from nemo_opd.secrets import redact_text
from nemo_opd.utils.text_width import console_width, wrapped_lines

EXIT_INTERRUPTED = 130
"""Exit status of a command stopped by SIGINT (Ctrl-C): 128 + SIGINT, the shell's convention."""


def print_error(error: BaseException | str) -> None:
    """Print `error` to standard error as `error: ...`, redacted and fitted (module
    docstring)."""
    print_fitted(f"error: {redact_text(str(error))}")


def print_interrupted(consequence: str = "") -> None:
    """Report a command stopped at once by SIGINT (Ctrl-C), and what that left
    (`consequence`, if given), in place of KeyboardInterrupt's traceback."""
    ending = f": {consequence}" if consequence else ""
    print_fitted(f"stopped at once by SIGINT (Ctrl-C){ending}")


def print_fitted(text: str) -> None:
    """`text` to standard error, each line wrapped at a terminal's width (only on one): every
    message of a command to its user there (errors, the notice of a stop signal)."""
    if sys.stderr.isatty():
        text = wrapped_lines(text, console_width(sys.stderr))
    print(text, file=sys.stderr, flush=True)
