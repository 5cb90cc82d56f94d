"""The Ray options of a vLLM engine actor: resources, and the OpenMP threads it runs on CPU."""

from nemo_opd.generation.vllm_generation import _actor_options
from nemo_opd.generation.vllm_worker import ENGINE_ENV


def test_cpu_engine_reserves_nothing_and_runs_on_the_threads_it_is_given():
    options = _actor_options("cpu", False, None, None, cpu_threads=2)
    assert (options["num_cpus"], options["num_gpus"]) == (0.0, 0)
    env = options["runtime_env"]["env_vars"]
    assert env["OMP_NUM_THREADS"] == "2"  # Ray would give an actor with no CPUs one thread
    assert all(env[key] == value for key, value in ENGINE_ENV.items())


def test_cpu_engine_threads_default_to_its_reserved_cpus_or_one():
    env = _actor_options("cpu", False, None, None)["runtime_env"]["env_vars"]
    assert env["OMP_NUM_THREADS"] == "1"
    env = _actor_options("cpu", False, 3.0, None)["runtime_env"]["env_vars"]
    assert env["OMP_NUM_THREADS"] == "3"


def test_cuda_engine_leaves_threads_to_ray():
    options = _actor_options("cuda", True, None, None, cpu_threads=8)
    assert (options["num_cpus"], options["num_gpus"]) == (1.0, 0.5)
    assert "OMP_NUM_THREADS" not in options["runtime_env"]["env_vars"]
