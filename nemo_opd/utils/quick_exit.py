"""End a finished command's process without Python's module teardown.

    sys.exit(main())        # an orderly exit, then the freeing of torch's, transformers'
                            # and Ray's objects one by one (its cost: docs/benchmarks.md)
    quick_exit(main())      # the same orderly steps, then the process ends at once

What an orderly exit does that matters is kept: threads that are not daemons are waited for (if
any is still running, this falls back to sys.exit, which also stops the thread pools of
concurrent.futures), the atexit handlers run (logging's flush, multiprocessing's children, Ray's
disconnect), and stdout and stderr are flushed. What is skipped is the interpreter's teardown
after them: the garbage collection of every module's objects and the extensions' destructors,
which write nothing and release only memory the process is about to give back.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
from typing import NoReturn


def quick_exit(status: int) -> NoReturn:
    """Exit with `status` as sys.exit would, less the interpreter's teardown (module
    docstring). Only for the end of a command's process, never inside a library call."""
    others = [
        thread
        for thread in threading.enumerate()
        if thread is not threading.main_thread() and not thread.daemon and thread.is_alive()
    ]
    if others or threading.current_thread() is not threading.main_thread():
        sys.exit(status)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
            stream.flush()
    os._exit(status)
