"""docs/self_distillation.md records the shipped self-distillation config as the README's
command runs it: that command with examples/configs/distillation_tiny_self.yaml, its date,
the held-out accuracy at each validation from the start, and a gain of at least 5 points with
no teacher model built (issue 66's check, as measured).
"""

import re

from doc_markdown import REPO, sections

PAGE = REPO / "docs" / "self_distillation.md"
CONFIG = "examples/configs/distillation_tiny_self.yaml"
ACCURACIES = re.compile(r"\*\*(\d+\.\d)%((?: -> \d+\.\d%)+)\*\*")


def readme_command(config: str) -> str:
    """The README's command for the loop, with `config` in place of the tiny default's."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    default = "uv run --extra cpu examples/run_distillation_math.py --config "
    assert default + "examples/configs/distillation_tiny.yaml" in readme
    return default + config


def shipped_section():
    found = [s for s in sections(PAGE) if s.title == "The shipped config"]
    assert len(found) == 1, [s.title for s in sections(PAGE)]
    return found[0]


def gain(text: str) -> float:
    """Points from the first accuracy of the recorded sequence to its last."""
    match = ACCURACIES.search(" ".join(text.split()))
    assert match, "no **A% -> ... -> B%** sequence"
    first = float(match.group(1))
    last = float(match.group(2).rsplit("-> ", 1)[1].rstrip("%"))
    return last - first


def test_the_shipped_config_is_measured_with_the_readme_command():
    text = shipped_section().text
    assert readme_command(CONFIG) in text
    assert re.search(r"\b20\d\d-[01]\d-[0-3]\d\b", text)
    assert "no teacher model is built" in " ".join(text.split())
    assert gain(text) >= 5.0


def test_the_gain_reads_the_first_and_last_figures():
    assert gain("x **34.2% -> 35.2% -> 44.0%** y") == 44.0 - 34.2
    assert gain("**40.0% -> 38.0%**") == -2.0
