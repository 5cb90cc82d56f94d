"""The math environment: grades the final answer of each rollout against the reference answer,
in a pool of Ray actors, with a time limit on every answer."""

import time
from collections import deque
from collections.abc import Callable

import ray
from ray.exceptions import RayError

from nemo_opd.config import MathEnvConfig
from nemo_opd.environments.base import EnvironmentStep, Message
from nemo_opd.environments.math_verify import verify

CheckFn = Callable[[str, str, int], bool]
"""check(response, reference, max_answer_chars) -> correct; math_verify.verify by default."""

_READY_TIMEOUT_S = 120.0
"""How long a new verification actor may take to start before the environment gives up."""


class _VerifyWorker:
    """Checks one answer per call (made a Ray actor by _RemoteVerifyWorker)."""

    def __init__(self, check: CheckFn, max_answer_chars: int):
        self._check = check
        self._max_answer_chars = max_answer_chars

    def ready(self) -> bool:
        """Returns once the actor process is up."""
        return True

    def check(self, response: str, reference: str) -> bool:
        """Whether response's final answer matches reference; any error counts as wrong."""
        try:
            return bool(self._check(response, reference, self._max_answer_chars))
        except Exception:
            return False


# num_cpus=0: verification is short, bursty work between generation and training. Reserving a
# CPU per actor would take CPUs away from the training/generation workers' placement (or make a
# small node unable to place them at all), while the actors are idle most of the time.
_RemoteVerifyWorker = ray.remote(num_cpus=0, max_restarts=0)(_VerifyWorker)


def _split_evenly(n: int, parts: int) -> list[range]:
    """Contiguous index ranges covering range(n), sizes differing by at most one."""
    base, extra = divmod(n, parts)
    ranges, start = [], 0
    for k in range(parts):
        size = base + (1 if k < extra else 0)
        ranges.append(range(start, start + size))
        start += size
    return ranges


def _last_assistant_content(message_log: list[Message]) -> str:
    """The content of the conversation's last assistant message ("" if there is none)."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


class MathEnvironment:
    """Verifies final answers in cfg.num_workers Ray actors.

    Time limit design: the driver keeps at most one answer in flight per actor and gives each
    call a deadline of cfg.timeout_s from its submission (ray.wait with a timeout). An answer
    that misses its deadline counts as wrong, and its actor is killed (ray.kill ends the process,
    so a runaway check, even one stuck in C code holding the GIL, stops using CPU) and replaced
    by a fresh one; the rest of its share of the batch continues once the new actor is up, while
    the other actors go on meanwhile. An actor that dies (e.g. out of memory) is replaced the
    same way. The checks themselves are bounded too (math_verify refuses oversized input), so
    timeouts are a second line of defence. Cost: one Ray call per answer (about 0.4 s for 512
    answers on 2 workers, 2 busy CPU cores).

    Each actor gets a contiguous, even share of the batch; results are put back in batch order.
    Needs Ray to be initialized by the caller.

    check replaces math_verify.verify (a hook for tests and other answer formats); it is
    shipped to the actors, so it must be picklable by Ray.
    """

    def __init__(self, cfg: MathEnvConfig, check: CheckFn = verify):
        if not ray.is_initialized():
            raise RuntimeError("MathEnvironment needs Ray: call ray.init() before creating it")
        self.cfg = cfg
        self._check = check
        self._workers = [self._start_worker() for _ in range(cfg.num_workers)]
        ray.get([w.ready.remote() for w in self._workers], timeout=_READY_TIMEOUT_S)

    def _start_worker(self):
        """A new verification actor (not yet waited for)."""
        return _RemoteVerifyWorker.remote(self._check, self.cfg.max_answer_chars)

    def verify_batch(self, responses: list[str], references: list[str]) -> list[bool]:
        """Whether each response's final answer matches its reference, in batch order. An answer
        whose check takes longer than cfg.timeout_s, or crashes its actor, is wrong."""
        if not self._workers:
            raise RuntimeError("MathEnvironment was shut down")
        results = [False] * len(responses)
        queues = [deque(r) for r in _split_evenly(len(responses), len(self._workers))]
        # ObjectRef -> (slot, batch index or None for a new actor's ready() call, deadline)
        in_flight: dict = {}

        def submit(slot: int) -> None:
            if queues[slot]:
                i = queues[slot].popleft()
                ref = self._workers[slot].check.remote(responses[i], references[i])
                in_flight[ref] = (slot, i, time.monotonic() + self.cfg.timeout_s)

        def replace(slot: int) -> None:
            # The answer's deadline starts once the new actor is up (not charged its start-up);
            # meanwhile the other actors go on.
            ray.kill(self._workers[slot], no_restart=True)
            self._workers[slot] = self._start_worker()
            ready_ref = self._workers[slot].ready.remote()
            in_flight[ready_ref] = (slot, None, time.monotonic() + _READY_TIMEOUT_S)

        for slot in range(len(self._workers)):
            submit(slot)
        while in_flight:
            earliest = min(deadline for _, _, deadline in in_flight.values())
            wait_s = max(0.0, earliest - time.monotonic())
            ready, _ = ray.wait(list(in_flight), num_returns=1, timeout=wait_s)
            for ref in ready:
                slot, i, _ = in_flight.pop(ref)
                try:
                    value = ray.get(ref)
                except RayError:
                    if i is None:
                        raise  # a fresh actor failed to start: the cluster is in trouble
                    replace(slot)  # the check killed its actor: the answer is wrong
                    continue
                if i is not None:
                    results[i] = bool(value)
                submit(slot)
            now = time.monotonic()
            for ref, (slot, i, deadline) in list(in_flight.items()):
                if deadline <= now:
                    if i is None:
                        raise RuntimeError(
                            f"a verification actor did not start in {_READY_TIMEOUT_S} s"
                        )
                    del in_flight[ref]  # results[i] stays False
                    replace(slot)
        return results

    def step(self, message_logs: list[list[Message]], metadata: list[dict]) -> EnvironmentStep:
        """Reward 1.0 for a correct final answer, else 0.0. Correct answers end the episode;
        wrong ones too unless cfg.retry_on_wrong, which instead asks for another try (the rollout
        loop enforces the turn limit). metadata[i]["answer"] is the reference; the returned
        metadata counts "attempts"."""
        if len(message_logs) != len(metadata):
            raise ValueError(f"{len(message_logs)} conversations but {len(metadata)} metadata")
        for i, meta in enumerate(metadata):
            if "answer" not in meta:
                raise ValueError(f'metadata[{i}] has no "answer" (the reference answer)')
        responses = [_last_assistant_content(log) for log in message_logs]
        correct = self.verify_batch(responses, [str(meta["answer"]) for meta in metadata])

        retry = self.cfg.retry_on_wrong
        return EnvironmentStep(
            rewards=[1.0 if ok else 0.0 for ok in correct],
            done=[ok or not retry for ok in correct],
            next_messages=[
                None if ok or not retry else {"role": "user", "content": self.cfg.retry_message}
                for ok in correct
            ],
            metadata=[{**meta, "attempts": int(meta.get("attempts", 0)) + 1} for meta in metadata],
        )

    def shutdown(self) -> None:
        """Kill the verification actors (safe to call twice)."""
        for worker in self._workers:
            ray.kill(worker, no_restart=True)
        self._workers = []
