"""Progress lines for long work over many items (a large dataset's prompts rendered and
tokenized at setup): nothing while the work is short, a line every PERIOD_S seconds once it is
not, and a closing line after such lines, so that a run with a million prompts is never silent
for a minute."""

import time
from collections.abc import Callable

from nemo_opd.utils.text_width import wrapped

PERIOD_S = 10.0
"""Seconds between progress lines; work that ends sooner prints none."""


class CountProgress:
    """Progress of `what` ("data: rendering the train prompts"), told by `update(done, total)`
    as items finish (from one thread at a time; the first update, with done 0, starts its
    clock) and `finish(total)` at the end. Lines read "<what>: <done> of <total> (<seconds> s)"
    and, closing, "<what>: <total> in <seconds> s"."""

    def __init__(
        self,
        what: str,
        period_s: float = PERIOD_S,
        clock: Callable[[], float] = time.monotonic,
        write: Callable[[str], None] = print,
    ) -> None:
        self.what = what
        self._period_s = period_s
        self._clock = clock
        self._write = write
        self._start: float | None = None
        self._next = 0.0
        self.lines = 0
        """Progress lines printed so far."""

    def update(self, done: int, total: int) -> None:
        """`done` of `total` items are finished; a line if PERIOD_S passed since the last."""
        now = self._clock()
        if self._start is None:
            self._start, self._next = now, now + self._period_s
        if now < self._next:
            return
        self._next = now + self._period_s
        self.lines += 1
        self._write(wrapped(f"{self.what}: {done:,} of {total:,} ({now - self._start:.0f} s)"))

    def finish(self, total: int) -> None:
        """All `total` items are finished: a closing line if progress lines were printed."""
        if self.lines and self._start is not None:
            elapsed = self._clock() - self._start
            self._write(wrapped(f"{self.what}: {total:,} in {elapsed:.1f} s"))
