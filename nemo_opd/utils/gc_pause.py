"""Python's garbage collection kept off the process's long-lived objects: paused while a run
starts, and collected once where a library would collect several times.

    with collection_paused():
        ...imports, building models and engines...
    # what survived is frozen: the collector never walks it again

    with collections_deferred():
        engine.shutdown()     # its gc.collect() calls do nothing
    # one full collection here frees what they would have

Importing torch, transformers and vLLM and building a run create millions of objects that live
as long as the process, and the collector's automatic passes walk all of them again and again
while they are made (docs/benchmarks.md has what that costs). Inside the block those passes are
off; at its end everything still alive is frozen (gc.freeze: moved to a generation the collector
skips), then automatic collection is on again for what the loop creates. Frozen objects are still
freed when nothing refers to them; only garbage in reference cycles among them stays until
gc.unfreeze() (DistillationRun.shutdown calls it, and vLLM's engine, which freezes its own start
the same way, does at its shutdown).

A full collection walks every tracked object of the process (CHANGELOG.md, 2026-11-30, has
what one costs in a run's process): vLLM's engine teardown unfreezes the process and collects
twice, once in its model runner's teardown and once after destroying its process groups, the
second finding almost nothing the first left. collections_deferred makes those calls no-ops
for the block and collects once at its end.
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


@contextlib.contextmanager
def collections_deferred() -> Iterator[None]:
    """gc.collect() does nothing inside the block (in every thread of the process: it is the
    module's function that is replaced, for the block only); one full collection at its end,
    also when the block raises. Automatic collection is untouched."""
    collect = gc.collect
    gc.collect = _no_collection
    try:
        yield
    finally:
        gc.collect = collect
        gc.collect()


def _no_collection(generation: int = 2) -> int:
    """gc.collect's stand-in inside collections_deferred: nothing collected."""
    return 0
