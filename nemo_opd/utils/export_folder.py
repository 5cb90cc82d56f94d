"""The folder of an exported model: written whole, and only where nothing else is lost.

    with export_directory(target, {"checkpoint": "...", "step": 350}) as tmp:
        ...write the model into tmp...

An export (a run's final_model, python -m nemo_opd.export's -o folder) is built in a hidden
sibling folder and renamed into place (nemo_opd.utils.checkpoint.atomic_directory), so a reader
sees the previous model or the new one, never half of one. The last file written is
MARKER_FILE, which says that nemo_opd wrote the folder and from what. A folder may be replaced
only when it is absent, empty, or holds that marker (an earlier export); any other folder is
refused, with what it holds, before anything is written: an export never deletes files it did
not write.
"""

import json
import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from nemo_opd import __version__
from nemo_opd.errors import SetupError
from nemo_opd.utils.checkpoint import BACKUP_SUFFIX, atomic_directory

MARKER_FILE = "nemo_opd_export.json"
"""Written last into every export: {"exported_by": "nemo_opd", "version", "source": {...}}."""
EXPORTED_BY = "nemo_opd"
FINAL_MODEL_DIR = "final_model"
"""A run's own export, in checkpointing.checkpoint_dir."""
UNMARKED_EXPORT_NAMES = frozenset(
    {
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "added_tokens.json",
        "chat_template.jinja",
        "vocab.json",
        "merges.txt",
        "tokenizer.model",
        "adapter",
    }
)
"""What a run's final_model held before exports were marked: the only names an unmarked
folder may hold to be replaced as an earlier final export (check_export_target)."""
_SHOWN = 4


def export_record(folder: Path) -> dict[str, Any] | None:
    """The marker of an export in `folder` (its "source" says what was exported), or None when
    the folder is not an export of nemo_opd."""
    try:
        record = json.loads((folder / MARKER_FILE).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    if not isinstance(record, dict) or record.get("exported_by") != EXPORTED_BY:
        return None
    return record


def check_export_target(target: Path, earlier_unmarked: bool = False) -> None:
    """SetupError unless writing an export to `target` loses nothing: the folder is absent,
    empty, or an earlier export (and so is a `<target>.previous` left by an interrupted
    replacement, which the write would otherwise delete). earlier_unmarked (a run's own
    final_model, in the checkpoint directory it owns): a folder of a model and tokenizer alone
    (UNMARKED_EXPORT_NAMES), as final exports were before they were marked, counts as one."""
    for folder in (target, target.with_name(target.name + BACKUP_SUFFIX)):
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            raise SetupError(
                f"the export folder {folder} exists and is not a folder; name a new folder"
            )
        if not folder.exists() or export_record(folder) is not None:
            continue
        names = {entry.name for entry in folder.iterdir()}
        if earlier_unmarked and "config.json" in names and names <= UNMARKED_EXPORT_NAMES:
            continue
        if names:
            entries = sorted(names)
            shown = ", ".join(entries[:_SHOWN]) + (", ..." if len(entries) > _SHOWN else "")
            raise SetupError(
                f"the export folder {folder} is not empty and is not a model exported by "
                f"nemo_opd (it holds {shown}): an export replaces its folder whole, so name a "
                f"new or empty folder (e.g. {folder / 'model'}), or move those files away"
            )


@contextmanager
def export_directory(
    target: Path, source: Mapping[str, Any], earlier_unmarked: bool = False
) -> Iterator[Path]:
    """An empty folder to write an export into; on normal exit the marker (naming `source`)
    is written last and the folder replaces `target` atomically, with the usual permissions.
    Refuses (check_export_target) before anything is written; on an exception nothing
    changes."""
    check_export_target(target, earlier_unmarked)
    with atomic_directory(target) as tmp:
        yield tmp
        record = {"exported_by": EXPORTED_BY, "version": __version__, "source": dict(source)}
        (tmp / MARKER_FILE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        check_export_target(target, earlier_unmarked)  # nothing else came while it was written


def exported_step(folder: str | os.PathLike) -> int | None:
    """The checkpoint step an export in `folder` was made from (None: not an export, or of
    no recorded step)."""
    record = export_record(Path(folder))
    step = record.get("source", {}).get("step") if record else None
    return step if isinstance(step, int) else None
