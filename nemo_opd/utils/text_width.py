"""The run's own console lines, fitted to the terminal (80 columns when it prints to a file).

Set-up lines (the workers, the data, the start-up marks) are wrapped at word boundaries with
an indented continuation; a word longer than the width (a path) is kept whole. The per-step
lines of a run printing to a file stay one line each (utils/console.py): they are read with
grep."""

import shutil
import sys
import textwrap
from collections.abc import Sequence
from typing import TextIO

CONSOLE_WIDTH = 80
"""The width of a console that is not a terminal (a log file, CI)."""


def console_width(stream: TextIO | None = None) -> int:
    """The terminal's columns when `stream` (standard output by default) is one, else
    CONSOLE_WIDTH."""
    if not (sys.stdout if stream is None else stream).isatty():
        return CONSOLE_WIDTH
    return shutil.get_terminal_size((CONSOLE_WIDTH, 24)).columns


def wrapped(text: str, indent: str = "  ", width: int | None = None) -> str:
    """`text` as lines of at most `width` columns (the console's), the second and later ones
    starting with `indent`."""
    return textwrap.fill(
        text,
        width or console_width(),
        subsequent_indent=indent,
        break_long_words=False,
        break_on_hyphens=False,
    )


def wrapped_lines(text: str, width: int) -> str:
    """Each line of `text` (a message and its indented list of problems) wrapped at `width`
    columns, its continuation indented two spaces past the line's own indentation."""
    lines = []
    for line in text.splitlines():
        indent = line[: len(line) - len(line.lstrip())] + "  "
        lines.append(wrapped(line, indent, width) if line.strip() else line)
    return "\n".join(lines)


def packed(parts: Sequence[str], head: str, separator: str, width: int | None = None) -> str:
    """`head` then `parts` joined by `separator`, as many per line as fit in `width` columns
    (the console's): a line that goes on ends with the separator ("a | b |", "a, b,"), and the
    next starts with as many spaces as `head` is long."""
    width = width or console_width()
    tail = separator.rstrip()
    lines, line = [], head
    for index, part in enumerate(parts):
        candidate = line + (separator if index else "") + part
        if index and len(candidate) + len(tail) > width:
            lines.append(line + tail)
            candidate = " " * len(head) + part
        line = candidate
    lines.append(line)
    return "\n".join(lines)
