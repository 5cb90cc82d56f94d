"""The process's torch thread count, kept across a block: a model started in the test process
(a policy on the local executor, a vLLM engine there) sets the process's own count, as a Ray
worker sets its process's."""

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def threads_kept() -> Iterator[None]:
    """torch's thread count as it was when the block began, put back when it is left."""
    import torch

    before = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(before)
