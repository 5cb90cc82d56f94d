"""Import modules in a background thread while the caller does other work.

    ahead = ImportAhead(["transformers"])   # starts importing now
    ...                                     # e.g. wait for a server to start
    ahead.join()                            # then `import transformers` is free

Only for modules whose import is pure CPU work independent of what the caller does meanwhile:
the thread must not import what the caller imports (two threads importing the same modules can
deadlock on Python's per-module import locks). An import that fails here ends the thread quietly:
the caller's own import raises it again, in the caller's thread, with its usual traceback.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Sequence


class ImportAhead:
    """A daemon thread importing `modules` in order (up to the first that fails)."""

    def __init__(self, modules: Sequence[str]) -> None:
        self.modules = tuple(modules)
        self._thread = threading.Thread(target=self._run, name="import-ahead", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for name in self.modules:
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - re-raised by the caller's own import
                return

    def join(self) -> None:
        """Wait until every module is imported (or one failed to)."""
        self._thread.join()
