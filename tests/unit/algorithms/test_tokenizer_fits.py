"""A tokenizer must fit the model it serves: every id it writes is a row of the model's
embedding (checked at setup, before any worker starts), and a configured tokenizer whose
vocabulary is not the model folder's own is said at start (a recipe's `tiny:tokenizer`
inherited with another model ended in an IndexError in a worker)."""

import shutil

import pytest

from nemo_opd.algorithms.model_checks import check_tokenizer_fits, load_model_config
from nemo_opd.algorithms.setup_models import check_models, resolve_model_paths
from nemo_opd.algorithms.tokenizers import load_tokenizer, own_tokenizer_note
from nemo_opd.config import TokenizerConfig, load_config
from nemo_opd.errors import SetupError
from nemo_opd.tiny.assets import ensure_tiny_assets, resolve_pretrained
from nemo_opd.tiny.recipe import micro_recipe
from nemo_opd.utils.run_dirs import with_absolute_paths

SFT = "examples/configs/sft_tiny.yaml"
"""A run without a teacher: no student-teacher vocabulary check covered the student."""


@pytest.fixture(scope="module")
def assets():
    return ensure_tiny_assets()


@pytest.fixture(scope="module")
def micro():
    return ensure_tiny_assets(micro_recipe())


def configured(*overrides):
    cfg = load_config(SFT, list(overrides))
    return resolve_model_paths(with_absolute_paths(cfg))


def test_a_tokenizer_with_more_ids_than_the_embedding_is_refused(assets, micro):
    # tiny:tokenizer (481 ids), inherited from the recipe, with a model of 320 rows.
    cfg = configured(f"policy.model_name={micro.student}")
    tokenizer = load_tokenizer(cfg.policy.tokenizer, "policy")
    config = load_model_config(cfg.policy, "policy")
    with pytest.raises(SetupError) as error:
        check_tokenizer_fits(tokenizer, config, "policy")
    assert str(error.value) == (
        "policy.tokenizer.name: the tokenizer writes ids up to 480, but policy.model_name has "
        "320 embedding rows (ids 0 to 319): the model cannot read its ids. Use the tokenizer "
        "the model was trained with: policy.tokenizer.name follows the model when set to "
        "${..model_name}"
    )
    own = load_tokenizer(TokenizerConfig(name=str(micro.student)), "policy")
    check_tokenizer_fits(own, config, "policy")


def test_setup_refuses_it_before_any_worker_starts(micro):
    # Without a teacher nothing compared the student's embedding with its tokenizer.
    with pytest.raises(SetupError, match=r"^policy\.tokenizer\.name: the tokenizer writes ids"):
        check_models(configured(f"policy.model_name={micro.student}"))


def test_a_tokenizer_that_is_not_the_models_own_is_said(assets, micro, tmp_path):
    student = tmp_path / "student"
    shutil.copytree(micro.student, student)
    cfg = configured(f"policy.model_name={student}").policy
    note = own_tokenizer_note(cfg, "policy")  # tiny:tokenizer, inherited, with another model
    assert note.startswith(
        f"warning: policy.tokenizer.name is {assets.tokenizer}, not the tokenizer of "
        f"policy.model_name ({student}), and their vocabularies differ (481 tokens against 320;"
    )
    assert note.endswith("set policy.tokenizer.name to the model's folder (${..model_name})")


def test_no_note_for_the_models_own_vocabulary(assets):
    # The tiny recipes name tiny:tokenizer, the vocabulary the tiny models' folders hold too.
    cfg = configured()
    assert cfg.policy.tokenizer.name != cfg.policy.model_name
    assert own_tokenizer_note(cfg.policy, "policy") is None
    follows = configured("policy.tokenizer.name=${..model_name}").policy
    assert own_tokenizer_note(follows, "policy") is None


def test_a_student_that_can_write_ids_past_the_teachers_rows_is_refused():
    # A student of another vocabulary (the tool task's, 528 ids) with the tiny teacher (481),
    # both reading the inherited tiny:tokenizer: every check passed, and the teacher's worker
    # met the student's ids past its embedding as an IndexError.
    student = resolve_pretrained("tiny:tools_student")
    cfg = resolve_model_paths(
        with_absolute_paths(
            load_config("examples/configs/distillation_tiny.yaml", [f"policy.model_name={student}"])
        )
    )
    with pytest.raises(SetupError) as error:
        check_models(cfg)
    assert str(error.value).startswith(
        "teacher: the student's vocabulary (528 ids) is larger than the teacher's (481), and the "
        "teacher reads the student's ids as they are"
    )
