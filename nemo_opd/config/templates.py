"""Format strings a user supplies, checked when the config loads with a dry run of the real call.

    teacher.prompt_template   fields named after the record: template.format(prompt=..., ...)
    data.prompt_file          one positional "{}" for the prompt: template.format(prompt)

Only plain fields are accepted (`{prompt}`, `{}`): no conversion (`{prompt!r}`), no format
specification (`{prompt:d}`, `{prompt:{answer}}`; a width such as `{prompt:>1000000000}` builds
a gigabyte per row), no attribute or index (`{0.foo}`, `{prompt[0]}`). Literal braces are
written twice (`\\boxed{{}}`). With plain fields nothing can pad the output: formatting costs
the template's length plus the values'.
"""

import string
from collections.abc import Iterator, Sequence
from pathlib import Path

from nemo_opd.config.schema import DistillationConfig

MAX_TEMPLATE_CHARS = 1 << 16
"""Longest template, inline or in a file."""

_BRACES = "write literal braces twice, e.g. \\boxed{{}}"

PRIVILEGED_FIELDS = ("prompt", "answer", "response")
"""What teacher.prompt_template may name: the record's prompt, reference answer and reference
response (data.response_key)."""


def template_fields(template: str) -> set[str]:
    """The {field} names a format string uses (ValueError if it is not one)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name is not None}


def template_problem(template: str, fields: Sequence[str] | None) -> str | None:
    """Why `template` cannot be formatted as the run will (None when it can): with `fields`,
    plain named fields among them; with None, exactly one positional "{}"."""
    if len(template) > MAX_TEMPLATE_CHARS:
        return f"has {len(template):,} characters, more than the {MAX_TEMPLATE_CHARS:,} allowed"
    try:
        parsed = [part for part in string.Formatter().parse(template) if part[1] is not None]
    except ValueError as error:
        return f"is not a valid format string ({error}): {_BRACES}"
    for _, name, spec, conversion in parsed:
        marks = (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        shown = "{" + name + marks + "}"
        if conversion or spec:
            return f"{shown} converts or formats its value; only plain fields are accepted"
        if any(mark in name for mark in ".["):
            return f"{shown} reads an attribute or item; only plain fields are accepted"
        if fields is None and name != "":
            return f'{shown} is a field, but the only one is "{{}}" for the prompt: {_BRACES}'
        if fields is not None and name not in fields:
            allowed = ", ".join("{" + field + "}" for field in fields)
            return f"names {shown}, which the records lack; it may use {allowed}"
    if fields is None and len(parsed) != 1:
        found = f"; it has {len(parsed)}: {_BRACES}" if parsed else ""
        return f'must contain one "{{}}" for the prompt{found}'
    args, kwargs = (("x",), {}) if fields is None else ((), dict.fromkeys(fields, "x"))
    try:  # the call the run makes, on sample values
        template.format(*args, **kwargs)
    except (IndexError, KeyError, ValueError) as error:
        return f"cannot be formatted ({error!r}): {_BRACES}"
    return None


def read_template_file(path: str) -> str:
    """A template file's text (trailing newlines dropped); ValueError saying what is wrong:
    missing, longer than MAX_TEMPLATE_CHARS, or not UTF-8."""
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"file not found: {file.resolve()}")
    with open(file, "rb") as handle:
        data = handle.read(4 * MAX_TEMPLATE_CHARS + 1)
    if len(data) > 4 * MAX_TEMPLATE_CHARS:
        raise ValueError(f"{file} is longer than a template may be ({MAX_TEMPLATE_CHARS:,} chars)")
    try:
        return data.decode("utf-8").strip("\n")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"could not read {file}: line {line} is not UTF-8 text (byte "
            f"0x{data[error.start]:02x}): save the file as UTF-8"
        ) from None


# -------- the checks of the config's templates (nemo_opd.config.checks runs them) -----------------


def check_privileged_teacher(cfg: DistillationConfig) -> Iterator[str]:
    """teacher.prompt_template has only plain fields ({prompt}, {answer}, {response}; no conversion,
    format specification, attribute or item), {response} with data.response_key set."""
    template = cfg.teacher.prompt_template if cfg.teacher is not None else None
    if template is None:
        return
    problem = template_problem(template, PRIVILEGED_FIELDS)
    if problem:
        yield f"teacher.prompt_template {problem}"
    elif "response" in template_fields(template) and cfg.data.response_key is None:
        yield (
            "teacher.prompt_template names {response}, but data.response_key is null; set it "
            "to the column holding the reference responses"
        )


def check_prompt_file(cfg: DistillationConfig) -> list[str]:
    """data.prompt_file is a UTF-8 file of at most 64k characters with one "{}" for the prompt
    and only plain text besides (literal braces doubled); read when the config loads."""
    if cfg.data.prompt_file is None:
        return []
    try:
        template = read_template_file(cfg.data.prompt_file)
    except (OSError, ValueError) as error:
        return [f"data.prompt_file: {error}"]
    problem = template_problem(template, None)
    return [f"data.prompt_file: the template {problem}"] if problem else []
