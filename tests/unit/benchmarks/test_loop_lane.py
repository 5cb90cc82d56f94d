"""The GPU lane's loop steps as the device machine runs them, on a CPU: `gpu_lane.sh --dry-run
g_loop h_shapes` in processes where `import ray` and `import vllm` raise ImportError (a meta-path
blocker installed through a sitecustomize on PYTHONPATH, as neither is installed there): the
tiny default for 2 steps in one process (local executor, transformers backend), and the
single-GPU recipe's phases at tiny shapes. Then every package those processes imported is one
the device has, or one the lane carries (benchmarks/gpu_wheels.py)."""

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_wheels  # noqa: E402

BLOCKED = ("ray", "vllm")
BLOCKER = f'''
"""Installed by tests/unit/benchmarks/test_loop_lane.py: {", ".join(BLOCKED)} cannot be imported
(the GPU machines have neither), and each process notes every top-level module it looks for
as it does (a process that is killed, such as a grader pool's worker, has noted them too)."""
import os
import sys

BLOCKED = {BLOCKED!r}


class DeviceMachineBlocker:
    def __init__(self):
        self.seen = set()
        # beside this file: a worker process may get another environment, not this folder
        folder = os.path.join(os.path.dirname(os.path.abspath(__file__)), "imports")
        self.path = os.path.join(folder, f"{{os.getpid()}}.txt")

    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED:
            raise ImportError(f"{{name}} is not installed on the GPU machines")
        if top not in self.seen:
            self.seen.add(top)
            with open(self.path, "a") as out:
                out.write(top + "\\n")
        return None


sys.meta_path.insert(0, DeviceMachineBlocker())
'''


def blocked_env(tmp_path: Path) -> dict:
    site = tmp_path / "blocker"
    site.mkdir()
    (site / "sitecustomize.py").write_text(BLOCKER)
    (site / "imports").mkdir()
    env = dict(os.environ, PYTHON=sys.executable, OUT=str(tmp_path / "out"))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env.pop("RAY_ADDRESS", None)
    return env


@pytest.fixture(scope="module")
def lane(tmp_path_factory):
    """(the lane's dry run of the loop steps, its summary, the modules each process imported)."""
    tmp_path = tmp_path_factory.mktemp("loop_lane")
    env = blocked_env(tmp_path)
    probe = [sys.executable, "-c", "import ray"]
    blocked = subprocess.run(probe, env=env, capture_output=True, text=True, timeout=120)
    assert blocked.returncode != 0 and "not installed on the GPU machines" in blocked.stderr
    command = ["bash", str(ROOT / "benchmarks" / "gpu_lane.sh"), "--dry-run", "g_loop", "h_shapes"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    summary = (tmp_path / "out" / "summary.md").read_text()
    imported = {
        path.stem: set(path.read_text().split())
        for path in (tmp_path / "blocker" / "imports").glob("*.txt")
    }
    return done, summary, imported


def test_the_loop_steps_run_without_ray_and_vllm(lane):
    done, summary, imported = lane
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "| g_loop | pass |" in summary and "| h_shapes | pass |" in summary
    # what the tiny run itself said it started: no Ray, the transformers engine on the
    # student's own module (a run that needed ray or vllm would have failed to import them)
    said = "workers: one process (cluster.executor local, no Ray): the student, the teacher, "
    assert said + "1 transformers engine generating from the student's module on " in summary
    assert "| 2 |" in summary and "status: 0, PASS" in summary  # two steps, to the end
    assert "| refit | 0.000 |" in summary  # nothing to copy
    assert "a copying refit's gather of the weights alone" in summary
    loop = [names for names in imported.values() if "nemo_opd" in names and "torch" in names]
    assert len(loop) >= 2  # the tiny command's process and the shapes benchmark's
    assert all(not names & set(BLOCKED) for names in imported.values())


def test_the_lane_carries_every_package_the_loop_imports(lane):
    """Each package of nemo_opd's requirements (and theirs) that the loop's processes imported
    is one the device machines have (gpu_wheels.DEVICE_PACKAGES) or one the lane carries (the
    closure of gpu_wheels.LANE_PACKAGES' requirements for Python 3.12). Packages imported only
    because a device package looks for them (transformers' optional imports) are the device's
    own business."""
    _, _, imported = lane
    modules = set().union(*imported.values()) - set(sys.stdlib_module_names)
    owners = importlib.metadata.packages_distributions()
    found = {
        gpu_wheels.canonicalize_name(dist) for module in modules for dist in owners.get(module, [])
    }
    needed = gpu_wheels.project_requirements(imported=found)  # not the device packages' needs
    assert {"torch", "transformers", "pydantic", "math-verify"} <= needed  # the loop's, found
    carried = gpu_wheels.installed_closure()
    missing = sorted(needed - gpu_wheels.DEVICE_PACKAGES - carried)
    assert not missing, f"the loop imports {missing}: neither on the device nor carried"
