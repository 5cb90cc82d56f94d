"""teacher.source: a teacher model of its own, or the student itself (student, ema, lagged):
the shipped config, and each refusal in one line naming its keys."""

from pathlib import Path

import pytest
from config_errors import error_of, problems

from nemo_opd.config import ConfigError, load_config, validate_config
from nemo_opd.config.checks import checkpoint_metrics
from nemo_opd.errors import SetupError
from nemo_opd.teacher_server import build_parser, settings_from_config
from nemo_opd.utils.checkpoint_manager import CheckpointManager
from nemo_opd.utils.run_dirs import with_absolute_paths
from nemo_opd.utils.run_identity import check_run_folders, run_identity

CONFIGS = Path(__file__).resolve().parents[3] / "examples" / "configs"
SELF = {"source": "ema", "prompt_template": "{prompt} {answer}"}


def as_self(minimal, **teacher) -> dict:
    """`minimal` with its teacher replaced by the student itself."""
    minimal["teacher"] = {**SELF, **teacher}
    return minimal


def test_the_shipped_config_is_the_student_as_its_own_teacher():
    cfg = load_config(CONFIGS / "distillation_tiny_self.yaml")
    assert cfg.self_teacher is cfg.teacher and cfg.teacher.source == "ema"
    assert cfg.teacher.model_name is None and cfg.teacher.tokenizer is None
    assert cfg.named_teachers == {} and cfg.teacher_sections == {}  # no model to load
    assert cfg.distillation.max_staleness == 0
    assert "validation/reverse_kl" in checkpoint_metrics(cfg)  # it still has a divergence
    for source in ("student", "lagged"):
        assert load_config(CONFIGS / "distillation_tiny_self.yaml", [f"teacher.source={source}"])


def test_a_teacher_model_of_its_own_is_the_default_source(minimal):
    cfg = validate_config(minimal)
    assert cfg.teacher.source == "model" and cfg.self_teacher is None
    assert list(cfg.named_teachers) == ["teacher"]


@pytest.mark.parametrize(
    "teacher, words",
    [
        ({"model_name": "tiny:student"}, "source ema scores with the student's own weights"),
        ({"tokenizer": {"name": "tiny:tokenizer"}}, "but tokenizer is set: set tokenizer to null"),
        ({"server": {"enabled": True}}, "it cannot be served"),
        ({"source": "model"}, "model_name, tokenizer, max_total_sequence_length must be set"),
    ],
)
def test_the_model_keys_must_match_the_source(minimal, teacher, words):
    message = error_of(as_self(minimal, **teacher))
    assert message.startswith("teacher: ") and words in message, message


def test_a_self_teacher_needs_the_loop_in_lockstep_and_no_seq_kd(minimal):
    data = as_self(minimal)
    data["distillation"].update(max_staleness=1, seq_kd=True, lmbda=0.5)
    data["data"]["response_key"] = "solution"
    found = problems(data)
    assert any(
        p.startswith("teacher.source ema scores on the student's own workers")
        and "set distillation.max_staleness to 0" in p
        for p in found
    ), found
    assert any("distillation.seq_kd samples from a teacher model of its own" in p for p in found)


def test_the_live_student_needs_a_privileged_prompt(minimal):
    message = error_of(as_self(minimal, source="student", prompt_template=None))
    assert "teacher.source student without teacher.prompt_template" in message
    assert validate_config(as_self(minimal, source="ema", prompt_template=None)).self_teacher


def test_a_self_teacher_is_not_routed(minimal):
    minimal.pop("teacher")
    minimal["teachers"] = {"own": dict(SELF)}
    minimal["data"]["teacher_key"] = "operation"
    message = error_of(minimal)
    assert "teachers.own.source is 'ema': a teacher that is the student itself" in message


def test_overrides_turn_the_tiny_teacher_into_the_student():
    tiny = CONFIGS / "distillation_tiny_100_lockstep.yaml"
    with pytest.raises(ConfigError, match="set model_name and tokenizer to null"):
        load_config(tiny, ["teacher.source=lagged"])
    cfg = load_config(
        tiny, ["teacher.source=lagged", "teacher.model_name=null", "~teacher.tokenizer"]
    )
    assert cfg.self_teacher.source == "lagged"


def test_there_is_no_model_to_serve():
    args = build_parser().parse_intermixed_args(["--config", "distillation_tiny_self.yaml"])
    with pytest.raises(ConfigError, match="the student itself .* no teacher model to serve"):
        settings_from_config(load_config(CONFIGS / "distillation_tiny_self.yaml"), args)


def test_checkpoints_of_another_source_are_refused_before_anything_starts(tmp_path):
    """The average or snapshot a checkpoint holds belongs to its source: a run of another
    source is refused by the run-identity check (before Ray or a model), naming both; the
    decay and the refresh period may change."""
    folders = [f"checkpointing.checkpoint_dir={tmp_path / 'ckpt'}"]
    folders.append(f"logger.log_dir={tmp_path / 'logs'}")

    def self_config(*overrides: str):
        tiny_self = CONFIGS / "distillation_tiny_self.yaml"
        return with_absolute_paths(load_config(tiny_self, [*folders, *overrides]))

    saved = self_config("teacher.source=ema")
    manager = CheckpointManager(saved.checkpointing, run_identity(saved))
    manager.save(20, lambda d: (d / "weights").write_bytes(b"w"), state={"loader": {}})
    with pytest.raises(SetupError) as caught:
        check_run_folders(self_config("teacher.source=lagged"))
    assert 'teacher.source: "ema" -> "lagged"' in str(caught.value)
    assert check_run_folders(self_config("teacher.ema_decay=0.5")) is None
