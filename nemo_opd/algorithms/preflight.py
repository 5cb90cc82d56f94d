"""The run's inputs checked before any process starts: the data files exist and every row holds
the configured columns, every model and tokenizer named by a local path is a folder that holds
one, and what a local model's config.json decides alone (the student's positions, each model's
heads against its tensor-parallel size, an output head nemo_opd reproduces) fits the config
(prompt files are read when the config loads). The command line runs these checks before Ray
starts (and --print-config after printing): the same mistakes found at setup would surface
only after the loop's imports, Ray, vLLM and the workers had started. Only local files are
read; nothing here imports torch or transformers, or contacts a hub.

Which names are local paths: nemo_opd.algorithms.local_paths.
"""

import json
from pathlib import Path
from types import SimpleNamespace

from nemo_opd.algorithms.data_mix import on_policy_share
from nemo_opd.algorithms.local_paths import is_local_model, missing_folder, nearest
from nemo_opd.algorithms.model_checks import (
    check_head_family,
    check_sequence_length,
    check_tensor_parallel,
    check_weights,
)
from nemo_opd.config import DistillationConfig, PolicyConfig
from nemo_opd.config.templates import template_fields
from nemo_opd.data.datasets import Split, load_prompt_records
from nemo_opd.errors import SetupError

MAX_CHECKED_BYTES = 64 * 2**20
"""Data files up to this size are read whole here (every row checked); a larger file is only
checked to exist, and its rows at setup."""
MODEL_CONFIG = "config.json"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
"""A folder holding one of these holds a tokenizer (AutoTokenizer reads it)."""


def check_inputs(cfg: DistillationConfig) -> None:
    """SetupError listing every problem input_problems finds (one per line), if any."""
    problems = input_problems(cfg)
    if len(problems) == 1:
        raise SetupError(problems[0])
    if problems:
        listed = "\n".join(f"  {problem}" for problem in problems)
        raise SetupError(f"the run's inputs have {len(problems)} problems:\n{listed}")


def input_problems(cfg: DistillationConfig) -> list[str]:
    """Every problem of the models, tokenizers and data files, as messages that name the key
    (see the module docstring)."""
    problems = []
    for section, model in _model_sections(cfg).items():
        problems += _model_problems(model, section, cfg)
    problems += _read_problems(lambda: _check_records(cfg, "train"))
    if cfg.distillation.validates:
        problems += _read_problems(lambda: _check_records(cfg, "validation"))
    return problems


def record_options(cfg: DistillationConfig, split: Split) -> dict:
    """load_prompt_records' keywords for a split of this run: `responses` when it reads the
    dataset's responses (train: off-policy steps that do not sample the teacher, or a teacher
    prompt that shows them; validation: the latter), `teachers` with several teachers."""
    template = cfg.teacher.prompt_template if cfg.teacher is not None else None
    privileged = template is not None and "response" in template_fields(template)
    off_policy = on_policy_share(cfg) < 1.0 and not cfg.distillation.seq_kd
    responses = privileged or (split == "train" and off_policy)
    teachers = list(cfg.teachers) if cfg.teachers is not None else None
    return {"responses": responses, "teachers": teachers}


def _model_sections(cfg: DistillationConfig) -> dict[str, PolicyConfig]:
    return {"policy": cfg.policy, **cfg.teacher_sections}


def _model_problems(model: PolicyConfig, section: str, cfg: DistillationConfig) -> list[str]:
    """A local model folder with a config and weights (a served teacher's model_name is the
    server's name: not checked), a local tokenizer folder with a tokenizer."""
    served = section == "teacher" and cfg.teacher.server.enabled
    problems = []
    if not served:
        problems += _folder_problems(model.model_name, f"{section}.model_name", (MODEL_CONFIG,))
    if not (problems and model.tokenizer.name == model.model_name):  # one folder, one message
        key = f"{section}.tokenizer.name"
        problems += _folder_problems(model.tokenizer.name, key, TOKENIZER_FILES)
    if not problems and not served and is_local_model(model.model_name):
        problems += _read_problems(lambda: check_weights(model, section))
        config = _model_config(Path(model.model_name))
        if config is not None:
            problems += _config_problems(model, config, section)
    return problems


def _config_problems(model: PolicyConfig, config: SimpleNamespace, section: str) -> list[str]:
    """What a model's config.json decides alone, checked as setup checks the whole transformers
    config (model_checks): the student's positions (vLLM holds it), the heads against the
    tensor-parallel size, an output head nemo_opd reproduces."""
    problems = []
    if section == "policy":
        problems += _read_problems(lambda: check_sequence_length(model, config, section))
    if isinstance(getattr(config, "num_attention_heads", None), int):  # else: left to setup
        problems += _read_problems(lambda: check_tensor_parallel(model, config, section))
    return problems + _read_problems(lambda: check_head_family(config, section))


def _model_config(folder: Path) -> SimpleNamespace | None:
    """The keys of a model folder's config.json as attributes (what the checks read of a
    transformers config), None when it does not parse: setup then names the problem."""
    try:
        data = json.loads((folder / MODEL_CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return SimpleNamespace(**data) if isinstance(data, dict) else None


def _folder_problems(name: str, key: str, needed: tuple[str, ...]) -> list[str]:
    """[the problem] of a local path that is no folder (local_paths.missing_folder) or holds
    none of `needed` (a model's config.json, a tokenizer's files); [] otherwise."""
    problem = missing_folder(name, key)
    if problem is not None:
        return [problem]
    folder = Path(name)
    if not is_local_model(name) or any((folder / file).is_file() for file in needed):
        return []
    what = "Hugging Face model" if needed == (MODEL_CONFIG,) else "tokenizer"
    return [
        f"{key}: {folder.absolute()} holds no {what} (none of {', '.join(needed)}): point it at "
        "a folder written by save_pretrained"
    ]


def _check_records(cfg: DistillationConfig, split: Split) -> None:
    """The split's rows, when they are a local file of at most MAX_CHECKED_BYTES (a larger one:
    that it exists), and that the train rows fill one step; or that a local dataset folder
    exists. Hub datasets and tiny_math are not read here."""
    data = cfg.data
    path = data.train_path if split == "train" else data.val_path
    key = "data.train_path" if split == "train" else "data.val_path"
    if path is None:
        key, name = "data.dataset_name", data.dataset_name
        if split == "validation" and data.val_dataset_name is not None:
            key, name = "data.val_dataset_name", data.val_dataset_name
        problem = missing_folder(name, key) if name is not None else None
        if problem is not None:
            raise SetupError(problem)
        return
    file = Path(path)
    if not file.is_file():
        raise SetupError(f"{key}: file not found: {file.resolve()}{nearest(file, folders=False)}")
    if file.stat().st_size > MAX_CHECKED_BYTES:
        return
    records = load_prompt_records(data, split, **record_options(cfg, split))
    step = cfg.distillation.num_prompts_per_step
    if split == "train" and len(records) < step:
        raise SetupError(
            f"distillation.num_prompts_per_step is {step} but {key} ({file}) has only "
            f"{len(records)} rows: lower distillation.num_prompts_per_step to at most "
            f"{len(records)} or add prompts"
        )


def _read_problems(check) -> list[str]:
    """[the message] of the SetupError check() raises, [] when it raises none."""
    try:
        check()
    except SetupError as error:
        return [str(error)]
    return []
