"""The errors the command line reports as one message, without a traceback.

SetupError: bad input found while building a run (data, tokenizers, models); exit status 2,
like a ConfigError. RunError: a run stopped by a fault it cannot recover from (a worker died, a
checkpoint could not be written); exit status 1, and the message says what survived and how to
go on (usually: run the same command again to resume).
"""


class SetupError(RuntimeError):
    """Bad input found at setup; the CLI prints the message and exits with status 2."""


class RunError(RuntimeError):
    """A fault that ended a run; the CLI prints the message and exits with status 1."""
