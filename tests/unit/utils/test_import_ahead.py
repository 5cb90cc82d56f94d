"""ImportAhead: modules imported in a background thread, failures left to the caller's import."""

import importlib
import sys

import pytest

from nemo_opd.utils.import_ahead import ImportAhead


def test_modules_are_imported_by_the_time_join_returns(tmp_path, monkeypatch):
    (tmp_path / "ahead_first.py").write_text("VALUE = 1\n")
    (tmp_path / "ahead_second.py").write_text("import ahead_first\nVALUE = ahead_first.VALUE + 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ahead = ImportAhead(["ahead_first", "ahead_second"])
    ahead.join()
    try:
        assert sys.modules["ahead_second"].VALUE == 2
    finally:
        sys.modules.pop("ahead_first", None)
        sys.modules.pop("ahead_second", None)


def test_a_failing_import_is_raised_by_the_callers_own_import(tmp_path, monkeypatch):
    (tmp_path / "ahead_broken.py").write_text("raise ImportError('broken on purpose')\n")
    (tmp_path / "ahead_after.py").write_text("VALUE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    ImportAhead(["ahead_broken", "ahead_after"]).join()  # no error here
    assert "ahead_broken" not in sys.modules and "ahead_after" not in sys.modules
    with pytest.raises(ImportError, match="broken on purpose"):
        importlib.import_module("ahead_broken")
