"""Python's automatic garbage collection paused while a run starts.

    with collection_paused():
        ...imports, building models and engines...
    # what survived is frozen: the collector never walks it again

Importing torch, transformers and vLLM and building a run create millions of objects that live
as long as the process, and the collector's automatic passes walk all of them again and again
while they are made (docs/benchmarks.md has what that costs). Inside the block those passes are
off; at its end everything still alive is frozen (gc.freeze: moved to a generation the collector
skips), then automatic collection is on again for what the loop creates. Frozen objects are still
freed when nothing refers to them; only garbage in reference cycles among them stays until
gc.unfreeze() (DistillationRun.shutdown calls it, and vLLM's engine, which freezes its own start
the same way, does at its shutdown).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """Automatic collection off inside the block; on exit, what is alive is frozen and automatic
    collection is back as it was (left off if it was off before)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()
