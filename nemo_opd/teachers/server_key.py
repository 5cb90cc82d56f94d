"""A served teacher's API key, read from the variable the config names.

Apart from the server checks (served_checks.py, which import torch and transformers) so that
`python -m nemo_opd.teacher_server` reads it without importing them: that command only
validates the config and starts vLLM's server, whose own processes import what they need.
"""

import os

from nemo_opd.config import TeacherServerConfig
from nemo_opd.errors import SetupError
from nemo_opd.secrets import register_secret


def server_api_key(server: TeacherServerConfig) -> str | None:
    """The API key from the variable teacher.server.api_key_env names, registered as a secret
    (redacted from everything the run prints); SetupError when the variable is not set."""
    if server.api_key_env is None:
        return None
    key = os.environ.get(server.api_key_env)
    if not key:
        raise SetupError(
            f"teacher.server.api_key_env names {server.api_key_env}, which is not set (or "
            "empty) in this environment; export the server's API key in it"
        )
    register_secret(key)
    return key
