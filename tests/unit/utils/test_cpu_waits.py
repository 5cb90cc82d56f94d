"""The command's OpenMP wait policy: passive unless the user chose one, set before torch loads."""

import os
import subprocess
import sys

CHILD = """
import os, sys
from nemo_opd.utils.cpu_waits import prefer_passive_waits
took = prefer_passive_waits()
print(os.environ["OMP_WAIT_POLICY"], took)
import torch
print("torch" in sys.modules)
"""


def run_child(env_value: str | None, code: str = CHILD) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if env_value is not None:
        env["OMP_WAIT_POLICY"] = env_value
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()


def test_a_fresh_process_gets_passive_waits_before_torch_loads():
    assert run_child(None) == ["PASSIVE", "True", "True"]


def test_the_users_own_policy_is_kept():
    assert run_child("ACTIVE") == ["ACTIVE", "True", "True"]


def test_after_torch_loaded_it_says_the_process_is_too_late():
    late = "import torch\n" + CHILD.replace("import torch\n", "")
    assert run_child(None, late) == ["PASSIVE", "False", "True"]


def test_the_command_line_sets_it_first(tmp_path):
    code = (
        "import sys\nfrom nemo_opd import cli\n"
        "status = cli.main(['--config', sys.argv[1], '--print-config'])\n"
        "import os; print(os.environ.get('OMP_WAIT_POLICY'))\n"
    )
    config = tmp_path / "bad.yaml"
    config.write_text("not_a_section: 1\n")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run(
        [sys.executable, "-c", code, str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.stdout.split()[-1] == "PASSIVE", done.stderr[-2000:]
