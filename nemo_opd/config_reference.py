"""Generate the key tables of the configuration reference (docs/config.md) from the schema.

    python -m nemo_opd.config_reference                          # print them
    python -m nemo_opd.config_reference --output docs/config.md  # write them into the page
    python -m nemo_opd.config_reference --check docs/config.md   # exit 1 if they are stale

The page is a hand-written guide (how a config is loaded), then the line GENERATED, then what
this module writes: a table row per field of the pydantic schema (its docstring is the
description) and the list of cross-field checks from nemo_opd.config.checks, so the tables
cannot drift from the code (a test compares the page with this module's output). --output
keeps the guide and replaces everything from GENERATED on.
"""

import argparse
import inspect
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any

from pydantic.fields import FieldInfo

from nemo_opd.config.checks import CHECKS
from nemo_opd.config.key_paths import section_model
from nemo_opd.config.model_schema import PolicyConfig, TeacherConfig
from nemo_opd.config.schema import DistillationConfig

GENERATED = (
    "<!-- Below this line generated from the schema by `python -m nemo_opd.config_reference "
    "--output docs/config.md`; edit the schema's docstrings, not the tables. -->"
)
"""The line that ends the page's hand-written guide (loading, inheritance, interpolation,
overrides, untrusted input) and starts what this module writes."""

KEYS = """\
## Keys

Columns: the key path, its type, its default (*required* when there is none), its constraint,
and what it does. Sections that default to `null` are optional.
"""


def render_reference() -> str:
    """The generated part of the reference page (from GENERATED on), as Markdown."""
    parts = [f"{GENERATED}\n\n{KEYS}"]
    for name, field in DistillationConfig.model_fields.items():
        if name == "teacher":
            parts += _render_teacher(field)
        elif name == "teachers":
            parts.append(_teachers_note(field))
        else:
            parts += _render_section(name, field, level=3)
    parts.append(_render_checks())
    return "\n".join(parts)


TEACHER_ONLY = [
    name for name in TeacherConfig.model_fields if name not in PolicyConfig.model_fields
]
"""The keys a teacher has beyond the policy's schema (server, prompt_template)."""


def _render_teacher(field: FieldInfo) -> list[str]:
    """The teacher shares the policy's schema: a note instead of a copy of its tables, then a
    table of the keys only a teacher has and their sections."""
    fields = TeacherConfig.model_fields
    leaves = [name for name in TEACHER_ONLY if not _is_section(fields[name])]
    parts = [
        f"### teacher\n\n{_clean(field.description)} Every key of `policy` is a key of the "
        "teacher too (TeacherConfig extends PolicyConfig): `teacher.model_name`, "
        "`teacher.dtensor_cfg.*`, and so on; the training-only keys (`train_*`, "
        "`max_grad_norm`) are unused. The keys only a teacher has:\n",
        _table([_row(f"teacher.{name}", fields[name]) for name in leaves]),
    ]
    for name in TEACHER_ONLY:
        if _is_section(fields[name]):
            parts += _render_section(f"teacher.{name}", fields[name], 4)
    return parts


def _teachers_note(field: FieldInfo) -> str:
    """Several teachers: a mapping of teacher sections, a note instead of a table."""
    return (
        f"### teachers\n\n{_clean(field.description)} So an entry's keys are "
        "`teachers.<name>.model_name`, `teachers.<name>.dtensor_cfg.*`, and so on, each "
        "checked under its own key path. Defaults to `null`.\n"
    )


def _render_section(path: str, field: FieldInfo, level: int) -> list[str]:
    """A heading, the section's description, a table of its leaf keys, then its subsections."""
    model = section_model(field.annotation)
    assert model is not None, path
    doc = _clean(inspect.getdoc(model))
    nullable = not field.is_required() and _default(field) is None
    if nullable:  # the field's description says what null means
        doc = f"{_clean(field.description)} {doc} Defaults to `null`."
    header = f"{'#' * level} {path}\n\n{doc}"
    leaves = [(name, sub) for name, sub in model.model_fields.items() if not _is_section(sub)]
    parts = [header + "\n"]
    if leaves:
        parts.append(_table([_row(f"{path}.{name}", sub) for name, sub in leaves]))
    for name, sub in model.model_fields.items():
        if _is_section(sub):
            parts += _render_section(f"{path}.{name}", sub, level=min(level + 1, 4))
    return parts


def _render_checks() -> str:
    """The cross-field checks, one bullet each, from the check functions' docstrings."""
    lines = [
        "## Cross-field checks\n",
        "Run after every field is valid; all failures are reported together.\n",
    ]
    for check in CHECKS:
        summary = _clean((inspect.getdoc(check) or "").split("\n\n")[0])
        lines.append(f"- {summary}")
    lines.append(
        "\nFound at setup instead, when tokenizers are loaded: whether teacher and student "
        "share a tokenizer and chat template (where they differ, the teacher reads the "
        "student's text in its own tokens: [cross_tokenizer.md](cross_tokenizer.md)), and "
        "that `distillation.topk_logits_k` is at most the vocabulary size.\n"
    )
    return "\n".join(lines)


def _table(rows: list[str]) -> str:
    """A Markdown table of key rows (_row), with its header."""
    header = "| key | type | default | constraint | description |\n| --- | --- | --- | --- | --- |"
    return "\n".join([header, *rows]) + "\n"


def _row(path: str, field: FieldInfo) -> str:
    """One table row for a leaf key."""
    cells = [
        f"`{path}`",
        _type_name(field.annotation),
        _default_text(field),
        _constraint_text(field),
        _clean(field.description),
    ]
    return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"


def _is_section(field: FieldInfo) -> bool:
    return section_model(field.annotation) is not None


def _default(field: FieldInfo) -> Any:
    """The field's default value (None for a required field)."""
    return None if field.is_required() else field.get_default(call_default_factory=True)


def _default_text(field: FieldInfo) -> str:
    if field.is_required():
        return "*required*"
    return f"`{_yaml_value(_default(field))}`"


def _yaml_value(value: Any) -> str:
    """A default as it would be written in YAML."""
    if isinstance(value, tuple):
        value = list(value)
    return json.dumps(value) if not isinstance(value, str) else value


def _type_name(annotation: Any) -> str:
    """A short, YAML-oriented name for a field's type."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is type(None):
        return "null"
    if origin is typing.Literal:
        return " | ".join(f'"{arg}"' for arg in args)
    if origin in (typing.Union, types.UnionType):
        return " | ".join(_type_name(arg) for arg in args)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin in (list, tuple):
        inner = ", ".join(_type_name(arg) for arg in args if arg is not Ellipsis)
        return f"list[{inner}]" if origin is list else f"[{inner}]"
    return getattr(annotation, "__name__", str(annotation))


# Constraint attributes of pydantic's Field(...) metadata (annotated_types.Gt, Ge, ...).
_BOUNDS = (
    ("gt", "> {}"),
    ("ge", ">= {}"),
    ("lt", "< {}"),
    ("le", "<= {}"),
    ("min_length", "length >= {}"),
)


def _constraint_text(field: FieldInfo) -> str:
    """The field's numeric and length bounds, e.g. `>= 0, <= 1`; for tuples, each item's."""
    bounds = _bounds(field.metadata)
    if not bounds:
        items = typing.get_args(field.annotation)
        item_bounds = {tuple(_bounds(typing.get_args(item)[1:])) for item in items}
        if len(item_bounds) == 1 and (shared := item_bounds.pop()):
            bounds = ["each " + ", ".join(shared)]
    return ", ".join(bounds)


def _bounds(metadata: Any) -> list[str]:
    """Render the bounds found in a field's (or an Annotated type's) metadata."""
    found = []
    for item in metadata:
        if isinstance(item, FieldInfo):
            found += _bounds(item.metadata)
        for attribute, template in _BOUNDS:
            if getattr(item, attribute, None) is not None:
                found.append(template.format(getattr(item, attribute)))
    return found


def _clean(text: str | None) -> str:
    """Collapse a docstring's whitespace into one line."""
    return " ".join((text or "").split())


def generated_part(page: str) -> str:
    """The part of a reference page this module writes: from GENERATED on ("" without it)."""
    start = page.find(GENERATED)
    return page[start:] if start >= 0 else ""


def main(argv: list[str] | None = None) -> int:
    """Print, write or check the generated part of the reference."""
    parser = argparse.ArgumentParser(description="Generate the configuration reference.")
    parser.add_argument("--output", type=Path, help="write the tables into this page")
    parser.add_argument("--check", type=Path, help="exit 1 if this page's tables are stale")
    args = parser.parse_args(argv)
    text = render_reference()
    if args.check:
        current = args.check.read_text(encoding="utf-8") if args.check.exists() else ""
        if generated_part(current) != text:
            print(
                f"{args.check} is stale; run: python -m nemo_opd.config_reference "
                f"--output {args.check}",
                file=sys.stderr,
            )
            return 1
        return 0
    if args.output:
        page = args.output.read_text(encoding="utf-8") if args.output.exists() else ""
        guide = page[: len(page) - len(generated_part(page))]
        args.output.write_text(guide + text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
