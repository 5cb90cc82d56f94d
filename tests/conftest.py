"""Settings for the whole suite, applied before any test module is imported."""

import os

# Read when ray is imported: under `uv run`, Ray would otherwise package the project and build a
# fresh venv for its workers (about a minute, more than some tests wait for a worker); the
# workers use this venv as is. The command line sets the same (nemo_opd.cli).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
