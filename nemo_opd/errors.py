"""SetupError: a problem with the user's inputs found while building a run (data, tokenizers,
models), reported as one message that says what is wrong and what to do."""


class SetupError(RuntimeError):
    """Bad input found at setup; the CLI prints the message and exits with status 2."""
