"""Every relative link of README.md, CHANGELOG.md and docs/ reaches a file of the repository,
and a `#anchor` a heading of that file (GitHub's anchors: lower case, punctuation dropped,
spaces as hyphens)."""

import re
from pathlib import Path

import pytest
from doc_markdown import DOC_FILES, REPO, prose

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*)$")
PAGES = [*DOC_FILES, REPO / "CHANGELOG.md"]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of a Markdown file's headings (outside code blocks)."""
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose(path.read_text(encoding="utf-8")):
        if match := HEADING.match(line):
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def links(path: Path):
    for number, line in prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(line):
            if not re.match(r"^[a-z]+:", target):  # http:, https:, mailto:
                yield number, target


CASES = [
    pytest.param(path, number, target, id=f"{path.relative_to(REPO)}:{number}:{target}")
    for path in PAGES
    for number, target in links(path)
]


def test_there_are_links():
    assert len(CASES) > 50


@pytest.mark.parametrize(("path", "number", "target"), CASES)
def test_link_resolves(path, number, target):
    file, _, anchor = target.partition("#")
    goal = (path.parent / file).resolve() if file else path
    assert goal.exists(), f"{path.relative_to(REPO)}:{number}: no {file}"
    if anchor and goal.suffix == ".md":
        assert anchor in anchors(goal), f"{path.relative_to(REPO)}:{number}: no #{anchor}"


def test_slug_matches_github():
    assert slug("Overlap: `benchmarks/bench_overlap.py`") == "overlap-benchmarksbench_overlappy"
    assert slug("What it accepts") == "what-it-accepts"
