"""docs/config.md is generated from the schema and must match the generator's output."""

from pathlib import Path

from pydantic import BaseModel

from nemo_opd.config import DistillationConfig
from nemo_opd.config.key_paths import section_model
from nemo_opd.config.reference import main, render_reference

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "config.md"


def _models(model: type[BaseModel]):
    yield model
    for field in model.model_fields.values():
        sub = section_model(field.annotation)
        if sub is not None:
            yield from _models(sub)


def test_docs_config_md_is_up_to_date():
    assert DOC.read_text(encoding="utf-8") == render_reference(), (
        "docs/config.md is stale; run: python -m nemo_opd.config.reference --output docs/config.md"
    )


def test_every_field_and_section_is_documented():
    for model in _models(DistillationConfig):
        assert model.__doc__, f"{model.__name__} has no docstring"
        for name, field in model.model_fields.items():
            assert field.description, f"{model.__name__}.{name} has no docstring"


def test_every_leaf_key_appears_in_the_reference():
    text = render_reference()

    def leaves(model, prefix):
        for name, field in model.model_fields.items():
            sub = section_model(field.annotation)
            if sub is None:
                yield f"{prefix}{name}"
            else:
                yield from leaves(sub, f"{prefix}{name}.")

    for path in leaves(DistillationConfig, ""):
        if path == "teachers":  # a mapping of teacher sections: a note, like teacher's
            assert "### teachers" in text and "`teachers.<name>.model_name`" in text
        elif not path.startswith("teacher.") or path.startswith("teacher.server."):
            assert f"| `{path}` |" in text, path


def test_check_mode(tmp_path, capsys):
    stale = tmp_path / "config.md"
    stale.write_text("old\n")
    assert main(["--check", str(stale)]) == 1
    assert "is stale" in capsys.readouterr().err
    assert main(["--output", str(stale)]) == 0
    assert main(["--check", str(stale)]) == 0
