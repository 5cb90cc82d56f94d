"""docs/config.md's key tables are generated from the schema and must match the generator's
output; the guide above them is written by hand and kept."""

from pathlib import Path

from pydantic import BaseModel

from nemo_opd.config import DistillationConfig
from nemo_opd.config.key_paths import section_model
from nemo_opd.config.model_schema import PolicyConfig, TeacherConfig
from nemo_opd.config_reference import GENERATED, generated_part, main, render_reference

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "config.md"


def _models(model: type[BaseModel]):
    yield model
    for field in model.model_fields.values():
        sub = section_model(field.annotation)
        if sub is not None:
            yield from _models(sub)


def test_docs_config_md_is_up_to_date():
    assert generated_part(DOC.read_text(encoding="utf-8")) == render_reference(), (
        "docs/config.md is stale; run: python -m nemo_opd.config_reference --output docs/config.md"
    )


def test_every_field_and_section_is_documented():
    for model in _models(DistillationConfig):
        assert model.__doc__, f"{model.__name__} has no docstring"
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def _leaves(model, prefix=""):
    for name, field in model.model_fields.items():
        sub = section_model(field.annotation)
        if sub is None:
            yield f"{prefix}{name}"
        else:
            yield from _leaves(sub, f"{prefix}{name}.")


def _row_of(text: str, path: str) -> str:
    """The reference's table row for `path` (AssertionError when there is none)."""
    rows = [line for line in text.splitlines() if line.startswith(f"| `{path}` |")]
    assert len(rows) == 1, f"{path}: {len(rows)} rows in the reference"
    return rows[0]


def test_every_leaf_key_appears_in_the_reference():
    """Every key of a run has its row: a teacher's own keys (server, prompt_template) under
    teacher, the keys it shares with the policy under policy; `teachers` entries take the
    teacher's keys, so each of those has a row too."""
    text = render_reference()
    policy_keys = set(_leaves(PolicyConfig))
    for path in _leaves(DistillationConfig):
        if path == "teachers":  # a mapping of teacher sections: a note, like teacher's
            assert "### teachers" in text and "`teachers.<name>.model_name`" in text
        elif path.startswith("teacher."):
            key = path.removeprefix("teacher.")
            _row_of(text, f"policy.{key}" if key in policy_keys else path)
        else:
            _row_of(text, path)
    for key in _leaves(TeacherConfig):  # what a `teachers.<name>` entry takes
        _row_of(text, f"policy.{key}" if key in policy_keys else f"teacher.{key}")


def test_teacher_only_keys_are_listed_under_teacher():
    """teacher.prompt_template (and every key the teacher has beyond the policy's) is in the
    teacher's section, not left to the note that sends readers to the policy's tables."""
    text = render_reference()
    section = text.split("### teacher\n", 1)[1].split("\n### ", 1)[0]
    own = set(_leaves(TeacherConfig)) - set(_leaves(PolicyConfig))
    assert "prompt_template" in own and "server.base_url" in own
    for key in own:
        assert f"| `teacher.{key}` |" in section, key


def test_teachers_note_says_what_an_entry_refuses():
    """The reference and the check agree on `teachers` entries: a served teacher and a
    prompt_template are refused there, and the note says so (no "every key of teacher")."""
    section = render_reference().split("### teachers\n", 1)[1].split("\n### ", 1)[0]
    assert "every key" not in section
    assert "`server.enabled`" in section and "`prompt_template`" in section
    assert "refused" in section


def test_check_mode(tmp_path, capsys):
    stale = tmp_path / "config.md"
    stale.write_text("old\n")
    assert main(["--check", str(stale)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0


def test_output_keeps_the_hand_written_guide(tmp_path):
    """--output replaces the tables from GENERATED on and keeps the guide above them."""
    page = tmp_path / "config.md"
    page.write_text(f"# Guide\n\nHow a config loads.\n\n{GENERATED}\n\nold tables\n")
    assert main(["--output", str(page)]) == 0
    assert page.read_text() == "# Guide\n\nHow a config loads.\n\n" + render_reference()
    assert main(["--check", str(page)]) == 0
