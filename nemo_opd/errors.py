"""The errors the command line reports as one message, without a traceback.

SetupError: bad input found while building a run (data, tokenizers, models); exit status 2,
like a ConfigError. RunError: a run stopped by a fault it cannot recover from (a worker died, a
checkpoint could not be written); exit status 1, and the message says what survived and how to
go on (usually: run the same command again to resume). ServiceError: a RunError from a service
outside the run's own workers (a served teacher); the workers are intact, so the loop saves the
last completed step before it ends.
"""


class SetupError(RuntimeError):
    """Bad input found at setup; the CLI prints the message and exits with status 2."""


class RunError(RuntimeError):
    """A fault that ended a run; the CLI prints the message and exits with status 1."""


class ServiceError(RunError):
    """A service outside the run's workers (a served teacher) failed or stayed down; the loop
    checkpoints its last completed step, then the CLI reports it like any RunError."""
