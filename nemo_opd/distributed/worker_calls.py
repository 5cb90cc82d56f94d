"""A call to a worker, as every executor makes it: how its method is named, how long it may take,
and the errors it ends with (nemo_opd.distributed.worker_group has the executors)."""

from collections.abc import Callable, Sequence
from typing import Any

from nemo_opd.errors import RunError

DEFAULT_TIMEOUT_S = 1800.0
"""How long a call (or a group's start) may take before it is reported as hung."""
PEER_DEATH_GRACE_S = 3.0
"""How long a call whose rank raised, while other ranks had not answered, waits for one of them
to be reported dead: a rank that dies in a collective makes its peers raise (a connection reset)
at once, and its death, the cause, is what the error names. A raise with no death behind it is
reported this much later."""
GROUP_TIMEOUT: Any = object()
"""run()'s timeout_s default: the group's own time-out (None is no limit)."""


class WorkerError(RunError):
    """A worker died, raised or did not answer; the message names the group, the rank and what
    happened (the worker's own exception is the __cause__).

    Attributes:
        rank: the rank that failed (None: several did not answer in time).
        died: its process ended (Ray and processes; a local worker's failure ends this
            process).
        detail: how the process ended ("pid N: ..."), or "<ExceptionType>: <message>".
        cause: the worker's own exception, where there is one.
    """

    def __init__(
        self,
        message: str,
        rank: int | None = None,
        *,
        died: bool = False,
        detail: str = "",
        cause: BaseException | None = None,
    ) -> None:
        super().__init__(message)
        self.rank, self.died, self.detail, self.cause = rank, died, detail, cause


def raised(group: str, rank: int, error: BaseException) -> WorkerError:
    """The WorkerError of a worker whose call raised `error`."""
    detail = f"{type(error).__name__}: {error}"
    return WorkerError(
        f"{group}: worker rank {rank} raised {detail}", rank, detail=detail, cause=error
    )


def died(group: str, rank: int, notice: str, cause: BaseException | None = None) -> WorkerError:
    """The WorkerError of a worker that died; `notice` says how ('pid N: ...', 'its constructor
    raised ...')."""
    return WorkerError(
        f"{group}: worker rank {rank} died ({notice}); the other ranks of the group cannot "
        "continue",
        rank,
        died=True,
        detail=notice,
        cause=cause,
    )


def hung(group: str, ranks: Sequence[int], what: str, timeout_s: float) -> WorkerError:
    """The WorkerError of ranks that did not `what` within timeout_s."""
    stuck = sorted(ranks)
    return WorkerError(f"{group}: ranks {stuck} did not {what} in {timeout_s} s", None)


def method_name(worker_cls: type, method: Callable) -> str:
    """The name under which `method` (a function of the worker class or of a Protocol it
    implements) is called on workers of `worker_cls`; TypeError when it has none."""
    if isinstance(method, str) or not hasattr(method, "__name__"):
        raise TypeError(f"name a worker method by its function (e.g. Worker.run), not {method!r}")
    name = method.__name__
    if not callable(getattr(worker_cls, name, None)):
        raise TypeError(f"{worker_cls.__name__} has no method {name}")
    return name
