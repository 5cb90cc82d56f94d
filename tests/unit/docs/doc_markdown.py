"""Reading the user docs (README.md, docs/*.md) as the tests of this folder need them: the
shell commands they show, and their sections (for the dates and sources of measured figures).

A command is a line of a fenced code block (backslash continuations joined, comments and
output lines dropped) or an inline code span that starts a program: `uv run ...`, `python ...`,
`bash ...`, `pytest ...`, or a script of the repository with arguments
(`examples/run_distillation_math.py --config ...`). Shell variables assigned earlier in the same
block (`common="..."`) are expanded; `ray job submit ... -- CMD` and `VAR=value CMD` give CMD.
"""

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOC_FILES = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md")])

_FENCE = re.compile(r"^(\s*)(```|~~~)(.*)$")
_HEADING = re.compile(r"^(#{1,6})\s+(.*)$")
_SPAN = re.compile(r"`([^`\n]+)`")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(\S*)$")
_VARIABLE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)
_LAUNCHERS = (
    "uv ",
    "python ",
    "python3 ",
    ".venv/bin/python ",
    "bash ",
    "pytest ",
    "ray job submit ",
)
_SCRIPT_WITH_ARGS = re.compile(r"^(examples|benchmarks)/\S+\.(py|sh)\s+\S")
SHELL_BLOCKS = ("", "bash", "sh", "shell", "console")


@dataclass(frozen=True)
class Command:
    """One command as a doc shows it: its words and where it is."""

    words: tuple[str, ...]
    doc: str
    line: int
    inline: bool = False

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}: {' '.join(self.words)}"


def _relative(path: Path) -> str:
    return str(path.relative_to(REPO))


def code_blocks(text: str) -> list[tuple[str, int, list[str]]]:
    """(language, first line number, lines) of every fenced block."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, language, start, body = match.group(2), match.group(3).strip(), i + 2, []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence):
            body.append(lines[i])
            i += 1
        blocks.append((language, start, body))
        i += 1
    return blocks


def prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of every line outside fenced blocks."""
    out, inside, fence = [], False, ""
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if match and (not inside or line.strip().startswith(fence)):
            inside, fence = not inside, match.group(2)
            continue
        if not inside:
            out.append((number, line))
    return out


def _joined(lines: list[str], first: int) -> list[tuple[int, str]]:
    """Backslash-continued lines joined into one, with the first line's number."""
    out, buffer, start = [], "", first
    for offset, line in enumerate(lines):
        if not buffer:
            start = first + offset
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            buffer += stripped[:-1] + " "
            continue
        out.append((start, buffer + stripped))
        buffer = ""
    if buffer:
        out.append((start, buffer))
    return out


def _words(line: str, variables: dict[str, str]) -> list[str] | None:
    """A line's words with $VAR / ${VAR} of the block expanded; None if it is not shell."""
    for name, value in variables.items():
        line = line.replace(f"${{{name}}}", value).replace(f"${name}", value)
    line = line.split(" # ", 1)[0] if not line.lstrip().startswith("#") else ""
    try:
        return shlex.split(line)
    except ValueError:
        return None


def _program(words: list[str]) -> list[str]:
    """The command a line runs: after VAR=value prefixes, `export`, and `ray job submit --`."""
    while words and _ASSIGN.match(words[0]) and len(words) > 1:
        words = words[1:]
    if words[:3] == ["ray", "job", "submit"] and "--" in words:
        words = words[words.index("--") + 1 :]
    return words


def _is_command(text: str) -> bool:
    """Whether a line or span runs a program with at least one argument (a bare `uv run` or
    a file name alone is prose)."""
    text = re.sub(r"^([A-Za-z_][A-Za-z0-9_]*=\S*\s+)+", "", text.strip())
    if _SCRIPT_WITH_ARGS.match(text):
        return True
    return text.startswith(_LAUNCHERS) and len(text.split()) >= 2


def commands(path: Path) -> list[Command]:
    """Every command a doc shows, in its code blocks and its inline code spans."""
    text = path.read_text(encoding="utf-8")
    found = []
    for language, first, body in code_blocks(text):
        if language == "yaml":  # a command held by a YAML value (a RayJob's entrypoint)
            found += _yaml_entrypoints(body, first, path)
            continue
        if language not in SHELL_BLOCKS:
            continue
        variables: dict[str, str] = {}
        for number, line in _joined(body, first):
            words = _words(line.strip(), variables)
            if not words:
                continue
            assigned = _VARIABLE.match(words[0]) if len(words) == 1 else None
            if assigned:
                variables[assigned.group(1)] = assigned.group(2)
                continue
            for part in _chain(words):
                if _is_command(" ".join(part)):
                    found.append(Command(tuple(_program(part)), _relative(path), number))
    for number, line in prose(text):
        for span in _SPAN.findall(line):
            if _is_command(span) and (words := _words(span, {})):
                for part in _chain(words):
                    command = Command(tuple(_program(part)), _relative(path), number, True)
                    found.append(command)
    return found


def _chain(words: list[str]) -> list[list[str]]:
    """`a && b ; c` as its commands."""
    parts: list[list[str]] = [[]]
    for word in words:
        if word in ("&&", "||", ";", "|"):
            parts.append([])
        else:
            parts[-1].append(word)
    return [part for part in parts if part]


def _yaml_entrypoints(body: list[str], first: int, path: Path) -> list[Command]:
    """A RayJob's `entrypoint: >-` (a folded YAML string over the following lines)."""
    out = []
    for index, line in enumerate(body):
        if line.strip().startswith("entrypoint:"):
            indent = len(line) - len(line.lstrip())
            parts = []
            for more in body[index + 1 :]:
                if len(more) - len(more.lstrip()) <= indent:
                    break
                parts.append(more.strip())
            if words := _words(" ".join(parts), {}):
                out.append(Command(tuple(_program(words)), _relative(path), first + index))
    return out


@dataclass(frozen=True)
class Section:
    """A heading and the lines under it up to the next heading, with the text of the sections
    it is nested in (below the page's title)."""

    doc: str
    line: int
    title: str
    text: str
    ancestors_text: str


def sections(path: Path) -> list[Section]:
    """The doc's sections (the text before the first heading is a section of its own)."""
    text = path.read_text(encoding="utf-8")
    heads = [(0, 0, "(top)")]  # (line index, level, title)
    inside = False
    lines = text.splitlines()
    for index, line in enumerate(lines):
        if _FENCE.match(line):
            inside = not inside
        elif not inside and (match := _HEADING.match(line)):
            heads.append((index, len(match.group(1)), match.group(2)))
    out: list[Section] = []
    stack: list[tuple[int, str]] = []  # (level, own text) of the open ancestors
    for number, (start, level, title) in enumerate(heads):
        end = heads[number + 1][0] if number + 1 < len(heads) else len(lines)
        own = "\n".join(lines[start:end])
        while stack and stack[-1][0] >= level and level > 0:
            stack.pop()
        # the page's title section (level 1) is no ancestor: its intro is about the page
        ancestors = "\n".join(text for lvl, text in stack if lvl > 1)
        out.append(Section(_relative(path), start + 1, title, own, ancestors))
        stack.append((level, own))
    return out
