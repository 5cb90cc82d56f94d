"""Waiting on Ray actors with a time-out that names what was waited for."""

from collections.abc import Sequence

import ray
from ray.exceptions import GetTimeoutError

from nemo_opd.errors import RunError


def get_within(refs: Sequence[ray.ObjectRef], timeout_s: float, what: str) -> list:
    """ray.get(refs), or RunError("<what>: no answer within <timeout_s> s") when it takes
    longer (a dead node, an actor stuck in a call)."""
    try:
        return ray.get(list(refs), timeout=timeout_s)
    except GetTimeoutError as error:
        raise RunError(f"{what}: no answer within {timeout_s:.0f} s") from error
