"""The table the converter prints: every NeMo-RL key under one of four headings.

    mapped as is      the keys, listed
    renamed           NeMo-RL key: value  ->  key here: value
    changed meaning   the same, and what it does here instead
    no equivalent     grouped by why

A row the student and the teacher share (same kind, value and note) is printed once, as
`{policy,teacher}.key`.
"""

import textwrap
from collections.abc import Iterable

from nemo_opd.config.errors import show
from nemo_opd.convert.nemo_rl_builder import Row
from nemo_opd.nemo_rl_keys import CATCH_ALL, KEY_MAP, TEACHER_FROZEN

HEADINGS = {
    "same": "mapped as is",
    "renamed": "renamed",
    "changed": "changed meaning, and what it does here instead",
    "dropped": "no equivalent, dropped, and why",
}
WIDTH = 100
BOTH = "{policy,teacher}."


def format_report(rows: list[Row]) -> str:
    """The table of every row, one section per kind."""
    rows = merge_models(rows)
    fates = _fates_under(rows)
    parts = []
    for kind, heading in HEADINGS.items():
        mine = [row for row in rows if row.kind == kind]
        if not mine:
            continue
        keys = "1 key" if len(mine) == 1 else f"{len(mine)} keys"
        parts.append(f"{heading} ({keys})")
        parts += _section(kind, mine, fates)
        parts.append("")
    return "\n".join(parts)


def _section(kind: str, rows: list[Row], fates: dict[str, set]) -> list[str]:
    if kind == "same":
        return _wrapped(", ".join(_collapsed([row.source for row in rows], fates)))
    if kind == "dropped":
        return _by_note(rows, fates)
    lines = []
    for row in rows:
        there = f"{row.source}: {show(row.value, limit=40)}"
        here = f"{row.target}: {show(row.written, limit=40)}" if row.target else "(no key)"
        lines.append(f"  {there}  ->  {here}")
        if row.note:
            lines += _wrapped(row.note, indent="      ")
    return lines


def _by_note(rows: list[Row], fates: dict[str, set]) -> list[str]:
    """Dropped keys grouped by their reason, in the order reasons first appear."""
    groups: dict[str, list[str]] = {}
    for row in rows:
        groups.setdefault(row.note, []).append(row.source)
    lines = []
    for note, sources in groups.items():
        lines += _wrapped(f"{note}:", indent="  ")
        lines += _wrapped(", ".join(_collapsed(sources, fates)), indent="      ")
    return lines


def _fates_under(rows: list[Row]) -> dict[str, set]:
    """For every section of a NeMo-RL key path (two keys deep and more): the (kind, note) of
    the rows under it; a `{policy,teacher}.` section's are those under both models'."""
    fates: dict[str, set] = {}
    for row in rows:
        for source in _concrete(row.source):
            parts = source.split(".")
            for end in range(2, len(parts)):
                fates.setdefault(".".join(parts[:end]), set()).add((row.kind, row.note))
    return fates


def _concrete(source: str) -> list[str]:
    """A row's source as the NeMo-RL key paths it stands for."""
    if source.startswith(BOTH):
        rest = source.removeprefix(BOTH)
        return [f"policy.{rest}", f"teacher.{rest}"]
    return [source]


def _collapsed(sources: list[str], fates: dict[str, set]) -> list[str]:
    """The keys, each section all of whose keys share one fate named once as `section.*`."""
    shown: dict[str, None] = {}
    for source in sources:
        parts = source.split(".")
        named = source
        for end in range(2, len(parts)):
            section = ".".join(parts[:end])
            under = set().union(*(fates.get(name, set()) for name in _concrete(section)))
            if len(under) == 1:
                named = f"{section}.*"
                break
        shown[named] = None
    return list(shown)


def _wrapped(text: str, indent: str = "  ") -> list[str]:
    return textwrap.wrap(
        text, WIDTH, initial_indent=indent, subsequent_indent=indent, break_on_hyphens=False
    )


def merge_models(rows: Iterable[Row]) -> list[Row]:
    """Rows with a policy/teacher twin (same kind, value, written value and note, the target
    moved along) printed once as {policy,teacher}.key."""
    rows = list(rows)
    by_source = {row.source: row for row in rows}
    merged, skipped = [], set()
    for row in rows:
        if row.source in skipped:
            continue
        twin = by_source.get(row.source.replace("policy.", "teacher.", 1))
        if row.source.startswith("policy.") and twin is not None and _twins(row, twin):
            skipped.add(twin.source)
            row = Row(
                row.kind,
                row.source.replace("policy.", BOTH, 1),
                row.value,
                row.target.replace("policy.", BOTH, 1) if row.target else None,
                row.written,
                row.note,
            )
        merged.append(row)
    return merged


def _twins(policy: Row, teacher: Row) -> bool:
    """Same kind, note and target (and, unless mapped as is, the same values)."""
    target = policy.target.replace("policy.", "teacher.", 1) if policy.target else None
    shape = (policy.kind, policy.note, target) == (teacher.kind, teacher.note, teacher.target)
    values = (policy.value, policy.written) == (teacher.value, teacher.written)
    return shape and (values or policy.kind == "same")


KIND_WORDS = {"same": "same", "renamed": "renamed", "changed": "changed", "dropped": "none"}


def markdown_key_map() -> str:
    """The key map as the Markdown table of docs/nemo_rl.md (`python -m nemo_opd.convert
    key-map` prints it): NeMo-RL key, key here, kind, note; `{model}` is policy or teacher."""
    lines = ["| NeMo-RL key | here | | what differs, or why none |", "|---|---|---|---|"]
    for table in (KEY_MAP, TEACHER_FROZEN, CATCH_ALL):
        for pattern, fate in table.items():
            target = f"`{fate.target}`" if fate.target else ""
            note = fate.note.replace("|", "\\|")
            lines.append(f"| `{pattern}` | {target} | {KIND_WORDS[fate.kind]} | {note} |")
    return "\n".join(lines) + "\n"
