"""Every measured figure in README.md and docs/ names its command, its config and its date.

The convention (docs/index.md, "Measured figures"): a figure sits in a section (the text under
a heading, down to the next heading) that gives the date it was measured, YYYY-MM-DD. That
section, or a section it is nested in, names

- the command that measured it: the loop's script (examples/run_distillation_math.py), a
  `python -m nemo_opd...` command, a benchmark (benchmarks/...py or .sh) or a test file
  (tests/...py, pytest);
- the config: the YAML file the run read (a `.yaml` name), unless every program named there
  takes no config file (a benchmark or module without a `--config` option, a test file), whose
  arguments are then its command's.

A measurement made by a script that is not in the repository (an exploratory probe) says so
in its section, in these words: "not a command of the repository". So a section with a date
and no command, or with the loop's command and no config, fails.
"""

import re
from importlib.util import find_spec
from pathlib import Path

import pytest
from doc_markdown import DOC_FILES, REPO, sections

DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
COMMAND = re.compile(
    r"examples/run_distillation_math\.py|python -m nemo_opd[\w.]*|benchmarks/\w+\.(?:py|sh)"
    r"|tests/[\w/]+\.py|\bpytest\b"
)
CONFIG = re.compile(r"[\w./-]+\.yaml\b")
SCRIPT = re.compile(r"benchmarks/\w+\.(?:py|sh)|tests/[\w/]+\.py")
GENERATED = {"docs/config.md"}
"""Pages written by a generator from the code (no measurements)."""


NOT_IN_REPO = "not a command of the repository"
_MAIN_FROM = re.compile(r"^from (nemo_opd[\w.]*) import main$", re.MULTILINE)


def _source(command: str) -> str:
    """The source of a named program: a script's file, or a module's (a package's __main__,
    and the module whose main it calls)."""
    if command.startswith(("benchmarks/", "tests/", "examples/")):
        path = REPO / command
    else:
        spec = find_spec(command.removeprefix("python -m "))
        if spec is None or spec.origin is None:
            return ""
        path = Path(spec.origin)
        if path.name == "__init__.py" and (path.parent / "__main__.py").is_file():
            path = path.parent / "__main__.py"
    if not path.is_file():
        return ""
    text = path.read_text(encoding="utf-8")
    if called := _MAIN_FROM.search(text):
        text += _source(f"python -m {called.group(1)}")
    return text


def takes_a_config(command: str) -> bool:
    """Whether a named program reads a run config (a `--config` option); tests do not."""
    if command.startswith("tests/") or command == "pytest":
        return False
    return '"--config"' in _source(command)


def problem(section) -> str | None:
    """Why a dated section breaks the convention, or None."""
    if not DATE.search(section.text):
        return None
    scope = section.text + "\n" + section.ancestors_text
    if NOT_IN_REPO in " ".join(scope.split()):
        return None
    named = COMMAND.findall(scope)
    if not named:
        return "a date without the command that measured it"
    if CONFIG.search(scope) or not any(takes_a_config(command) for command in named):
        return None
    return "a date and a command without the config the run read"


SECTIONS = [
    section
    for path in DOC_FILES
    if str(path.relative_to(REPO)) not in GENERATED
    for section in sections(path)
]


def test_the_docs_hold_dated_figures():
    dated = [section for section in SECTIONS if DATE.search(section.text)]
    assert len(dated) > 20


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: f"{s.doc}:{s.line}")
def test_figures_name_command_config_and_date(section):
    found = problem(section)
    assert found is None, f"{section.doc}:{section.line} ({section.title}): {found}"


def test_the_check_catches_a_bare_figure():
    """A date alone, or the loop's command without its config, is reported."""
    from doc_markdown import Section

    bare = Section("x.md", 1, "t", "## t\nIt took 4 s (2026-11-25).", "")
    assert problem(bare) == "a date without the command that measured it"
    loop = Section("x.md", 1, "t", "`examples/run_distillation_math.py`: 4 s, 2026-11-25", "")
    assert problem(loop) == "a date and a command without the config the run read"
    bench = Section("x.md", 1, "t", "`benchmarks/bench_scale.py`: 1 GiB, 2026-11-25", "")
    assert problem(bench) is None
