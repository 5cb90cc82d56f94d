"""Relative paths written in a config file resolve against that file's folder, so a recipe runs
from any working directory; those given on the command line against the working directory."""

from pathlib import Path

from nemo_opd.config import load_config

REPO = Path(__file__).resolve().parents[3]


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_the_shipped_math_recipe_loads_from_outside_the_repository(tmp_path, monkeypatch):
    # Its data.prompt_file was relative to the working directory: launched from elsewhere, the
    # recipe failed to load.
    monkeypatch.chdir(tmp_path)
    cfg = load_config(REPO / "examples/configs/distillation_math.yaml")
    assert cfg.data.prompt_file == str(REPO / "examples/prompts/math_boxed.txt")


def test_each_file_resolves_its_own_paths(write_yaml, minimal, tmp_path, monkeypatch):
    # A parent in one folder, a child in another, run from a third: each file's relative data
    # paths are its own folder's; names that are no path there (a hub dataset) stay as they are.
    base = write_yaml("base/base.yaml", {**minimal, "data": {"train_path": "data/train.jsonl"}})
    _write(tmp_path / "base/data/train.jsonl", "")
    _write(tmp_path / "run/prompts/user.txt", "Solve: {}\n")
    child = _write(
        tmp_path / "run/child.yaml",
        f"defaults: ../base/base.yaml\ndata:\n  prompt_file: prompts/user.txt\n"
        f"  val_path: {tmp_path / 'elsewhere.jsonl'}\n",
    )
    monkeypatch.chdir(_write(tmp_path / "cwd/.keep", "").parent)
    cfg = load_config(child)
    assert cfg.data.train_path == str(tmp_path / "base/data/train.jsonl")
    assert cfg.data.prompt_file == str(tmp_path / "run/prompts/user.txt")
    assert cfg.data.val_path == str(tmp_path / "elsewhere.jsonl")  # absolute: unchanged
    assert Path(base).parent == tmp_path / "base"

    hub = load_config(child, ["~data.train_path", "data.dataset_name=org/math"])
    assert hub.data.dataset_name == "org/math"  # a hub name, no folder of that name there
    _write(tmp_path / "run/saved/state.json", "{}")
    saved = _write(
        tmp_path / "run/saved.yaml",
        "defaults: child.yaml\ndata:\n  val_path: null\n  val_dataset_name: saved\n",
    )
    assert load_config(saved).data.val_dataset_name == str(tmp_path / "run/saved")


def test_the_command_line_resolves_against_the_working_directory(
    write_yaml, minimal, tmp_path, monkeypatch
):
    config = write_yaml("conf/run.yaml", minimal)
    _write(tmp_path / "cwd/prompts/user.txt", "Solve: {}\n")
    monkeypatch.chdir(tmp_path / "cwd")
    cfg = load_config(config, ["+data.prompt_file=prompts/user.txt"])
    assert cfg.data.prompt_file == "prompts/user.txt"  # read from the working directory


def test_a_name_no_file_can_have_stays_a_name(write_yaml, minimal):
    # Looking such a name up as a path raises (a part too long, a NUL byte), not "not there".
    for name in ("x" * 300, "a\x00b"):
        minimal["data"] = {"dataset_name": name}
        assert load_config(write_yaml("conf.yaml", minimal)).data.dataset_name == name
