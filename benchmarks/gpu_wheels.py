"""Build the wheels the GPU lane carries to a device machine (benchmarks/gpu_lane.sh).

    python benchmarks/gpu_wheels.py [--dest .whl] [--check-install]

The device machine has Python 3.12, torch, triton, transformers, peft, numpy and pytest, no
network, and none of nemo_opd's config stack or megatron-core. This command downloads, from the
package index pip is configured with, the wheels of the packages the lane needs that are missing
there (LANE_PACKAGES, at the versions pyproject.toml pins for Python 3.12 with the gpu extra),
then every requirement of theirs that the device lacks (DEVICE_PACKAGES), for CPython 3.12 on
manylinux x86_64. A requirement published only as a source archive is built into a wheel here,
and refused unless the result is pure Python. The bundle must stay under BUNDLE_LIMIT_MIB (what
one device call carries); --check-install then installs it offline (--no-index) into a fresh
Python 3.12 virtual environment and imports what needs no torch (the device has torch already).

The wheels land in --dest (ignored by git; the device call names it in `carry`).
"""

import argparse
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from email.parser import Parser
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
LANE_PACKAGES = (
    "pydantic", "omegaconf", "hydra-core", "megatron-core", "math-verify", "liger-kernel",
)  # fmt: skip
"""What the lane imports that the device lacks: nemo_opd.config (pydantic, omegaconf, hydra's
override grammar), the Megatron engine, the math environment's grader (math-verify: the loop
steps run the tiny task), and the peer i_liger runs beside the loss path (liger-kernel)."""
DEVICE_PACKAGES = frozenset(
    canonicalize_name(name)
    for name in (
        "absl-py", "accelerate", "aiofiles", "aiohappyeyeballs", "aiohttp", "aiosignal",
        "annotated-doc", "anyio", "attrs", "botorch", "build", "certifi", "charset-normalizer",
        "chex", "click", "cloudpickle", "cmake", "colorama", "contourpy", "coverage",
        "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "cupy-cuda13x",
        "cycler", "cython", "diffrax", "e3nn", "einops", "equinox", "etils", "execnet",
        "filelock", "flatbuffers", "flax", "fonttools", "formulaic", "frozenlist", "fsspec",
        "gpytorch", "grpcio", "h11", "h5py", "hf-xet", "httpcore", "httpx", "huggingface-hub",
        "humanize", "hypothesis", "idna", "imageio", "iniconfig", "interface-meta", "jax",
        "jax-cuda13-pjrt", "jax-cuda13-plugin", "jaxlib", "jaxtyping", "jinja2", "joblib",
        "kiwisolver", "lazy-loader", "lightning", "lightning-utilities", "linear-operator",
        "lineax", "llvmlite", "lxml", "markdown", "markdown-it-py", "markupsafe", "matplotlib",
        "mdurl", "meson", "ml-dtypes", "mpi4py", "mpmath", "msgpack", "multidict",
        "multipledispatch", "mypy-extensions", "nanobind", "narwhals", "networkx", "ninja",
        "numba", "numba-cuda", "numpy", "numpyro", "nvidia-cublas", "nvidia-cuda-cupti",
        "nvidia-cuda-nvrtc", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-cufft",
        "nvidia-cufile", "nvidia-curand", "nvidia-cusolver", "nvidia-cusparse",
        "nvidia-cusparselt-cu13", "nvidia-ml-py", "nvidia-nccl-cu13", "nvidia-nvjitlink",
        "nvidia-nvshmem-cu13", "nvidia-nvtx", "onnx", "onnx-ir", "onnxruntime", "onnxscript",
        "opencv-python-headless", "optax", "opt-einsum", "opt-einsum-fx", "optimistix",
        "orbax-checkpoint", "packaging", "pandas", "pathspec", "patsy", "peft", "pillow", "pip",
        "pluggy", "portalocker", "prometheus-client", "propcache", "protobuf", "psutil",
        "pyarrow", "pybind11", "py-cpuinfo", "pygments", "pyparsing", "pyproject-hooks",
        "pyre-extensions", "pytest", "pytest-benchmark", "pytest-cov", "pytest-mock",
        "pytest-timeout", "pytest-xdist", "python-dateutil", "pytorch-lightning", "pyyaml",
        "regex", "requests", "rich", "sacrebleu", "safetensors", "scikit-build-core",
        "scikit-image", "scikit-learn", "scipy", "seaborn", "sentencepiece",
        "sentence-transformers", "setuptools", "shellingham", "simplejson", "six",
        "sortedcontainers", "statsmodels", "sympy", "tabulate", "tensorboard",
        "tensorboard-data-server", "tensorstore", "threadpoolctl", "tifffile", "tiktoken",
        "timm", "tokenizers", "toolz", "torch", "torchaudio", "torchdiffeq", "torch-geometric",
        "torchmetrics", "torchvision", "tqdm", "transformers", "treescope", "triton", "typer",
        "typing-extensions", "typing-inspect", "urllib3", "uvloop", "wadler-lindig", "werkzeug",
        "wheel", "wrapt", "xarray", "xxhash", "yarl", "zipp",
    )
)  # fmt: skip
"""Installed on the device machines (the device tool's list of the image's packages, read
2026-11-17): never carried."""
NOT_ON_THE_DEVICE = frozenset({"ray", "vllm"})
"""nemo_opd's requirements that cannot travel there (too large, another torch): a run on the
device uses the local executor and the transformers generation backend instead."""
DEVICE_DEPENDENCIES = ("typing-extensions", "pyyaml", "packaging", "sympy")
"""The device's packages the torch-free part of the bundle imports (check_install)."""
PYTHON = "3.12"
MARKER_ENV = {
    "python_version": PYTHON,
    "python_full_version": f"{PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "extra": "",
}
PLATFORMS = (
    "manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
    "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64",
)  # fmt: skip
BUNDLE_LIMIT_MIB = 48
"""The device call carries 64 MiB in all, the working tree included."""


def lane_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[Requirement]:
    """LANE_PACKAGES as pyproject.toml pins them (dependencies, the gpu extra, and the dev
    group for the peers the lane measures beside) for Python 3.12 on Linux."""
    toml = tomllib.loads(pyproject.read_text())
    project, groups = toml["project"], toml["dependency-groups"]
    pins = [*project["dependencies"], *project["optional-dependencies"]["gpu"], *groups["dev"]]
    wanted = {canonicalize_name(name) for name in LANE_PACKAGES}
    found = {}
    for text in pins:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        if name in wanted and (req.marker is None or req.marker.evaluate(MARKER_ENV)):
            req.marker, req.extras = None, set()
            found[name] = req
    missing = wanted - found.keys()
    if missing:
        raise SystemExit(f"pyproject.toml pins none of {sorted(missing)} for Python {PYTHON}")
    return [found[canonicalize_name(name)] for name in LANE_PACKAGES]


def wheel_requirements(wheel: Path) -> list[Requirement]:
    """The wheel's own requirements that apply on the device (no extras)."""
    with zipfile.ZipFile(wheel) as archive:
        name = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        metadata = Parser().parsestr(archive.read(name).decode())
    requirements = []
    for text in metadata.get_all("Requires-Dist") or []:
        req = Requirement(text)
        if req.marker is None or Marker(str(req.marker)).evaluate(MARKER_ENV):
            requirements.append(req)
    return requirements


def installed_closure() -> set[str]:
    """What build_bundle carries, read from this environment's installed metadata instead of
    downloaded wheels (no network): LANE_PACKAGES and their requirements for Python 3.12 on
    Linux, recursively, less DEVICE_PACKAGES (canonical names)."""
    return _requirement_closure([Requirement(name) for name in LANE_PACKAGES]) - DEVICE_PACKAGES


def project_requirements(
    imported: set[str] | None = None, pyproject: Path = ROOT / "pyproject.toml"
) -> set[str]:
    """nemo_opd's requirements on the device (its dependencies and the gpu extra for Python
    3.12, less what the device cannot run: NOT_ON_THE_DEVICE) and theirs, recursively, as this
    environment's metadata gives them; a device package's own requirements are the device's
    (not followed). With `imported` (canonical names of the packages a run imported), only
    those, reached through those: what that run needs. Canonical names."""
    project = tomllib.loads(pyproject.read_text())["project"]
    texts = [*project["dependencies"], *project["optional-dependencies"]["gpu"]]
    wanted = [Requirement(text) for text in texts]
    wanted = [req for req in wanted if canonicalize_name(req.name) not in NOT_ON_THE_DEVICE]
    roots = [req for req in wanted if _applies(req)]
    return _requirement_closure(roots, stop=DEVICE_PACKAGES, only=imported)


def _requirement_closure(
    roots: list[Requirement], stop: frozenset = frozenset(), only: set[str] | None = None
) -> set[str]:
    """The roots and, except below a name in `stop`, their installed requirements (each with
    the extras asked of it), recursively; with `only`, no name outside it."""
    queue, found = list(roots), set()
    while queue:
        req = queue.pop()
        name = canonicalize_name(req.name)
        if name in found or (only is not None and name not in only):
            continue
        found.add(name)
        if name in stop:
            continue
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        queue.extend(r for r in map(Requirement, requires) if _applies(r, req.extras))
    return found


def _applies(req: Requirement, extras: set[str] | frozenset = frozenset()) -> bool:
    """Whether `req` is required on the device, with `extras` asked of its parent."""
    if req.marker is None:
        return True
    return any(req.marker.evaluate({**MARKER_ENV, "extra": e}) for e in ("", *extras))


def wheel_name(path: Path) -> str:
    return canonicalize_name(path.name.split("-")[0])


def download(req: Requirement, dest: Path) -> Path:
    """One wheel for CPython 3.12 manylinux x86_64 into dest; a source-only package is built
    here and must come out pure Python."""
    before = set(dest.glob("*.whl"))
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    command = [
        sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
        "--python-version", PYTHON, "--implementation", "cp", *platforms, "-d", str(dest),
        str(req),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest)]
        done = subprocess.run([*command, str(req)], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"no wheel for {req}: {done.stderr.strip()[-800:]}")
    new = sorted(set(dest.glob("*.whl")) - before)
    if len(new) != 1:
        raise SystemExit(f"expected one new wheel for {req}, got {[p.name for p in new]}")
    wheel = new[0]
    tags = wheel.stem.split("-")[-3:]
    if tags[1:] == ["none", "any"] or tags[0] == "cp312" or tags[1] == "abi3":
        return wheel
    raise SystemExit(f"{wheel.name} does not install on CPython {PYTHON}")


def build_bundle(dest: Path) -> list[Path]:
    """Download the lane's packages and the closure of their requirements the device lacks."""
    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob("*.whl"):
        old.unlink()
    queue, wheels, seen = list(lane_requirements()), [], set()
    while queue:
        req = queue.pop(0)
        name = canonicalize_name(req.name)
        if name in seen or name in DEVICE_PACKAGES:
            continue
        seen.add(name)
        wheel = download(req, dest)
        print(f"  {wheel.name}  ({wheel.stat().st_size / 2**20:.1f} MiB)", flush=True)
        wheels.append(wheel)
        queue.extend(wheel_requirements(wheel))
    total = sum(w.stat().st_size for w in wheels) / 2**20
    print(f"{len(wheels)} wheels, {total:.1f} MiB in {dest}")
    if total > BUNDLE_LIMIT_MIB:
        raise SystemExit(f"the bundle is {total:.1f} MiB, over {BUNDLE_LIMIT_MIB} MiB")
    return wheels


def find_python(version: str = PYTHON) -> str:
    """A Python `version` interpreter on this machine (PATH, then pyenv's)."""
    found = shutil.which(f"python{version}")
    if found and _reports(found, version):
        return found
    pyenv_root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    for candidate in sorted(pyenv_root.glob(f"versions/{version}*/bin/python{version}")):
        if _reports(str(candidate), version):
            return str(candidate)
    raise SystemExit(f"--check-install needs a Python {version} interpreter; none found")


def _reports(python: str, version: str) -> bool:
    done = subprocess.run(
        [python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return done.returncode == 0 and done.stdout.strip() == version


def check_install(dest: Path) -> None:
    """Install the bundle offline into a fresh Python 3.12 venv as the device does (pip
    --no-index --no-deps into a target folder) and import the torch-free packages."""
    python = find_python()
    with tempfile.TemporaryDirectory() as tmp:
        venv, site = Path(tmp) / "venv", Path(tmp) / "site"
        subprocess.run([python, "-m", "venv", str(venv)], check=True, timeout=300)
        python_in_venv = str(venv / "bin" / "python")
        pip = [python_in_venv, "-m", "pip", "install", "-q"]
        # what the device machine has already (pydantic and omegaconf need them); torch is
        # left out, so megatron-core's import is left to the lane's first step
        subprocess.run([*pip, "--no-compile", *DEVICE_DEPENDENCIES], check=True, timeout=600)
        wheels = [str(w) for w in sorted(dest.glob("*.whl"))]
        options = ["--no-index", "--no-deps", "--no-compile", "--target", str(site)]
        subprocess.run([*pip, *options, *wheels], check=True, timeout=600)
        code = (
            "import pydantic, pydantic_core, omegaconf, hydra, antlr4, math_verify\n"
            "from hydra.core.override_parser.overrides_parser import OverridesParser\n"
            "OverridesParser.create().parse_overrides(['a.b=1'])\n"
            "print('imports ok: pydantic', pydantic.VERSION, 'omegaconf', omegaconf.__version__)"
        )
        env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(site)}
        done = subprocess.run(
            [python_in_venv, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        if done.returncode != 0:
            raise SystemExit(f"the bundle does not import offline:\n{done.stderr[-2000:]}")
        print(done.stdout.strip())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    parser.add_argument("--check-install", action="store_true")
    args = parser.parse_args(argv)
    build_bundle(args.dest)
    if args.check_install:
        check_install(args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
