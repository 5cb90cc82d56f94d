"""README's "Your own model and data" section as a user follows it: its config block written to
my_run.yaml in a folder laid out as the repository's (examples/ beside it), the tiny models
saved as ordinary Hugging Face folders standing in for the user's (models/student,
models/teacher), a 50-line train.jsonl and a 20-line val.jsonl of their own; and its commands,
run as written with `uv run --extra cpu` replaced by this interpreter."""

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Your own model and data"


def section_blocks() -> tuple[str, list[list[str]]]:
    """The section's YAML block and its commands (each a list of words)."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]  # the fenced blocks' contents, language first
    yaml_block = next(block for block in blocks if block.startswith("yaml\n"))
    shell = next(block for block in blocks if block.startswith("bash\n"))
    commands = [shlex.split(line) for line in shell.splitlines()[1:] if line.strip()]
    return yaml_block.removeprefix("yaml\n"), commands


def user_folder(root: Path, assets) -> Path:
    """`root` laid out as the section asks: my_run.yaml, examples/ (the repository's), the
    models and the data; returns root."""
    config, _ = section_blocks()
    (root / "my_run.yaml").write_text(config)
    (root / "examples").symlink_to(REPO / "examples")
    (root / "models").mkdir()
    shutil.copytree(assets.student, root / "models" / "student")
    shutil.copytree(assets.teacher, root / "models" / "teacher")
    (root / "data").mkdir()
    for source, name, count in (
        (assets.train_file, "train", 50),
        (assets.validation_file, "val", 20),
    ):
        rows = [json.loads(line) for line in source.read_text().splitlines()[:count]]
        lines = [json.dumps({"problem": r["prompt"], "answer": r["answer"]}) for r in rows]
        (root / "data" / f"{name}.jsonl").write_text("\n".join(lines) + "\n")
    return root


def run_as_written(words: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess:
    """A command of the section in `cwd`, `uv run --extra cpu` being this interpreter."""
    assert words[:4] == ["uv", "run", "--extra", "cpu"], words
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, *words[4:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
