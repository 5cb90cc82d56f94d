"""Every command shown in README.md and docs/ parses: the module or script exists, its flags
are those of its argument parser, and the loop's overrides name keys of the config schema.

Nothing heavy runs: each command's own parser reads the command's words (argparse's parse
methods are patched to stop right after parsing), and a config the command names is loaded
with its overrides (a load only validates). Programs that are not the project's (ray, git,
pip, srun) are left alone.
"""

import argparse
import contextlib
import re
import runpy
import sys
import tomllib
import warnings
from importlib.util import find_spec

import pytest
from doc_markdown import DOC_FILES, REPO, Command, commands

from nemo_opd.config import ConfigError, load_config
from nemo_opd.config.key_paths import has_path
from nemo_opd.config.schema import DistillationConfig

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
EXTRAS = set(PYPROJECT["project"]["optional-dependencies"])
GROUPS = set(PYPROJECT.get("dependency-groups", {}))
PYTHONS = ("python", "python3", ".venv/bin/python")
PLACEHOLDER = re.compile(r"\.\.\.|<[^>]*>|\$")
"""Words a doc writes for the reader to fill in (`...`, `<checkout>`) or a shell expands."""


class _Parsed(Exception):
    """Raised by the patched parser once it has read a command's words."""

    def __init__(self, namespace: argparse.Namespace | None) -> None:
        self.namespace = namespace


class _Refused(Exception):
    """Raised by the patched parser's error(): what it refused."""


@contextlib.contextmanager
def _stop_after_parsing():
    """argparse's top-level parse calls parse as usual (errors exit 2), then raise _Parsed
    with the namespace instead of returning to the program."""
    originals = {
        name: getattr(argparse.ArgumentParser, name)
        for name in ("parse_args", "parse_known_args", "parse_intermixed_args", "error")
    }
    depth = [0]

    def patched(name):
        def parse(self, *args, **kwargs):
            depth[0] += 1
            try:
                result = originals[name](self, *args, **kwargs)
            finally:
                depth[0] -= 1
            if depth[0]:  # a parse inside another one (subparsers, parse_args' own call)
                return result
            raise _Parsed(result[0] if isinstance(result, tuple) else result)

        return parse

    def error(self, message):
        raise _Refused(message)

    for name in originals:
        setattr(argparse.ArgumentParser, name, error if name == "error" else patched(name))
    try:
        yield
    finally:
        for name, original in originals.items():
            setattr(argparse.ArgumentParser, name, original)


def _parse(run, program: str, args: list[str], partial: bool) -> argparse.Namespace | None:
    """The namespace the program's own parser makes of `args` (pytest.fail on its error). A
    partial command (named in a sentence, say `python -m nemo_opd.convert nemo-rl`) may leave
    out required arguments, but every flag it gives must exist; it gives no namespace."""
    saved = sys.argv, list(sys.path)
    sys.argv = [program, *args]
    try:
        with _stop_after_parsing():
            run()
    except _Parsed as parsed:
        return parsed.namespace
    except _Refused as refused:
        if partial and str(refused).startswith("the following arguments are required"):
            return None
        pytest.fail(f"{program} {' '.join(args)}: its parser refused it: {refused}")
    finally:
        sys.argv, sys.path[:] = saved
    pytest.fail(f"{program}: ran without parsing a command line")


def _check_uv(command: Command, words: list[str]) -> list[str]:
    """`uv run|sync` options: the extras and groups exist; returns the program after them."""
    rest = words[2:]
    while rest and rest[0].startswith("-"):
        option = rest.pop(0)
        if option in ("--extra", "--group", "--python"):
            value = rest.pop(0)
            known = {"--extra": EXTRAS, "--group": GROUPS}.get(option)
            assert known is None or value in known, f"{command.where}: no {option} {value}"
    return rest if words[1] == "run" else []


def _check_overrides(command: Command, namespace: argparse.Namespace | None) -> None:
    """The overrides name schema keys; with a config of the repository and nothing left for
    the reader to fill in, the config loads with them."""
    if namespace is None:
        return
    overrides = list(getattr(namespace, "overrides", None) or [])
    overrides += list(getattr(namespace, "set", None) or [])
    grid = list(getattr(namespace, "grid", None) or [])
    overrides += [axis.split(",")[0] for axis in grid]  # each axis's first point
    for override in overrides:
        key = override.lstrip("+~").split("=", 1)[0]
        assert "=" in override or override.startswith("~"), f"{command.where}: {override!r}"
        assert has_path(DistillationConfig, key.split(".")), f"{command.where}: no key {key}"
    configs = getattr(namespace, "config", None)
    configs = [configs] if isinstance(configs, str) else list(configs or [])
    concrete = not any(PLACEHOLDER.search(word) for word in overrides)
    for config in configs:
        if (REPO / config).is_file() and concrete:
            try:
                load_config(REPO / config, overrides)
            except ConfigError as error:
                pytest.fail(f"{command.where}: {error}")


def _check_python(command: Command, words: list[str]) -> None:
    """`python -m MODULE ...` or `python SCRIPT ...` (MODULE of nemo_opd; others skipped)."""
    if words == ["-m"]:
        return  # "run with `python -m`" in a sentence
    if words[0] == "-m":
        module, args = words[1], words[2:]
        if not module.startswith("nemo_opd"):
            return  # pip, vllm's server: not the project's
        assert find_spec(module) is not None, f"{command.where}: no module {module}"
        if command.inline and not args:
            return  # the module named in prose

        def run():
            with warnings.catch_warnings():  # a module this process imported already
                warnings.filterwarnings("ignore", "'.*' found in sys.modules", RuntimeWarning)
                runpy.run_module(module, run_name="__main__", alter_sys=True)

        namespace = _parse(run, module, args, command.inline)
    else:
        _check_script(command, words[0], words[1:])
        return
    _check_overrides(command, namespace)


def _check_script(command: Command, script: str, args: list[str]) -> None:
    path = REPO / script
    assert path.is_file(), f"{command.where}: no file {script}"
    if path.suffix == ".sh":
        _check_lane_steps(command, path, args)
        return
    if command.inline and not args:
        return

    def run():
        sys.path.insert(0, str(path.parent))  # as `python SCRIPT` has it (benchmarks' harness)
        runpy.run_path(str(path), run_name="__main__")

    namespace = _parse(run, script, args, command.inline)
    _check_overrides(command, namespace)


def _check_lane_steps(command: Command, path, args: list[str]) -> None:
    """gpu_lane.sh takes --dry-run, --all and the names of its steps."""
    steps = set(re.findall(r"^step (\w+) ", path.read_text(encoding="utf-8"), re.MULTILINE))
    for arg in args:
        assert arg in ("--dry-run", "--all") or arg in steps, f"{command.where}: no step {arg}"


def _check_pytest(command: Command, args: list[str]) -> None:
    for arg in args:
        if not arg.startswith("-"):
            path = arg.split("::")[0]
            assert (REPO / path).exists(), f"{command.where}: no test path {path}"


def check(command: Command) -> bool:
    """Check one command; False when it is not the project's (left alone)."""
    words = [word for word in command.words if word != "..."]  # "and more": left out
    if words[:2] in (["uv", "run"], ["uv", "sync"]):
        words = _check_uv(command, words)
        if not words:
            return True
    if not words:
        return True
    program, rest = words[0], words[1:]
    if program in PYTHONS:
        if rest:
            _check_python(command, rest)
        return True
    if program == "bash" and rest:
        _check_script(command, rest[0], rest[1:])
        return True
    if program == "pytest":
        _check_pytest(command, rest)
        return True
    if re.match(r"^(examples|benchmarks)/", program):
        _check_script(command, program, rest)
        return True
    return False


ALL = [command for path in DOC_FILES for command in commands(path)]


def test_the_docs_show_commands():
    """The extraction finds the commands (a change in the docs' markup would hide them)."""
    shown = " ".join(" ".join(command.words) for command in ALL)
    for needle in (
        "examples/run_distillation_math.py",
        "nemo_opd.teacher_server",
        "benchmarks/sweep.py",
        "nemo_opd.convert",
        "gpu_lane.sh",
    ):
        assert needle in shown, needle
    assert len(ALL) > 100


@pytest.mark.parametrize("command", ALL, ids=lambda command: f"{command.doc}:{command.line}")
def test_command_parses(command):
    check(command)


def test_a_wrong_flag_or_key_is_caught(tmp_path):
    """The check itself: a flag the parser lacks and a key the schema lacks both fail."""
    config = "examples/configs/distillation_tiny.yaml"
    bad = [
        f"uv run --extra cpu python -m nemo_opd.teacher_server --config {config} --no-such-flag",
        f"python examples/run_distillation_math.py --config {config} loss_fn.kl=x",
        f"python examples/run_distillation_math.py --config {config} loss_fn.kl_type=nonsense",
        "bash benchmarks/gpu_lane.sh z_nothing",
        "uv run --extra tpu pytest tests/unit",
    ]
    for line in bad:
        with pytest.raises((AssertionError, pytest.fail.Exception)):
            check(Command(tuple(line.split()), "test", 0))


def _example_configs():
    """The YAML blocks of the docs that extend a shipped config (`defaults: examples/...`)."""
    from doc_markdown import code_blocks

    for path in DOC_FILES:
        for language, line, body in code_blocks(path.read_text(encoding="utf-8")):
            text = "\n".join(body)
            if language == "yaml" and re.search(r"^defaults: examples/configs/", text, re.M):
                yield pytest.param(text, id=f"{path.relative_to(REPO)}:{line}")


@pytest.mark.parametrize("text", list(_example_configs()))
def test_example_configs_load(text, tmp_path):
    """A config a doc shows for the reader to copy loads as written (beside `examples/`)."""
    (tmp_path / "examples").symlink_to(REPO / "examples")
    (tmp_path / "my_run.yaml").write_text(text, encoding="utf-8")
    load_config(tmp_path / "my_run.yaml")
