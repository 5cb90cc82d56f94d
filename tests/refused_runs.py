"""How a refused run's message names a changed value, checked by the unit and functional tests
of run identity (nemo_opd/utils/run_identity.py)."""

import re
from pathlib import Path


def assert_shows_path(message: str, key: str, path: Path) -> None:
    """The message names key's change to `path`: the whole path, or, for a long one, its two
    ends around "..." (the file name kept)."""
    shown = re.search(rf'{re.escape(key)}: \(none\) -> "([^"]*)"', message)
    assert shown, message
    head, cut, tail = shown.group(1).partition("...")
    if not cut:
        assert head == str(path), message
    else:
        assert str(path).startswith(head) and str(path).endswith(tail), message
        assert tail.endswith(path.name), message
