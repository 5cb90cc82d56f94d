"""The math environment: grades the final answer of each rollout against the reference answer,
in grader worker processes with a hard time limit on every answer (grader_pool)."""

from nemo_opd.config import MathEnvConfig
from nemo_opd.data.message_log import Message
from nemo_opd.environments.base import EnvironmentStep
from nemo_opd.environments.grader_pool import GradeReport, GraderPool


def _last_assistant_content(message_log: list[Message]) -> str:
    """The content of the conversation's last assistant message ("" if there is none)."""
    for message in reversed(message_log):
        if message.get("role") == "assistant":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def report_metrics(report: GradeReport) -> dict[str, float]:
    """A grading report's counts as env/math/* metric names (without the prefix)."""
    return {
        "graded": float(len(report.verdicts)),
        "fast_path": float(report.fast),
        "grader_timeouts": float(report.timeouts),
        "grader_crashes": float(report.crashes),
    }


class MathEnvironment:
    """Grades final answers with cfg.grader in cfg.num_workers worker processes.

    An answer whose grading takes longer than cfg.timeout_s, or whose worker dies, is wrong; the
    worker is replaced and the rest of the batch goes on (GraderPool). Each step's metrics count
    the answers graded, those the fast path settled, time-outs and crashes.
    """

    def __init__(self, cfg: MathEnvConfig, wait: bool = True):
        """wait: return once the grader workers are ready (else wait_ready() waits)."""
        self.cfg = cfg
        self._pool = GraderPool(
            cfg.num_workers,
            cfg.timeout_s,
            cfg.max_answer_chars,
            cfg.grader,
            cfg.worker_memory_mb,
            cfg.require_marked_answer,
            wait=wait,
        )

    def wait_ready(self) -> None:
        """Return once every grader worker has started (GraderPoolError if one fails to within
        its time-out); each loads its engine when an answer first needs it."""
        self._pool.wait_ready()

    def verify_batch(self, responses: list[str], references: list[str]) -> GradeReport:
        """Whether each response's final answer matches its reference, in batch order."""
        return self._pool.grade(responses, references)

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
        report = self.verify_batch(responses, [str(meta["answer"]) for meta in metadata])

        retry = self.cfg.retry_on_wrong
        correct = report.verdicts
        return EnvironmentStep(
            rewards=[1.0 if ok else 0.0 for ok in correct],
            done=[ok or not retry for ok in correct],
            next_messages=[
                None if ok or not retry else {"role": "user", "content": self.cfg.retry_message}
                for ok in correct
            ],
            metadata=[{**meta, "attempts": int(meta.get("attempts", 0)) + 1} for meta in metadata],
            metrics=report_metrics(report),
        )

    def shutdown(self) -> None:
        """Stop the grader workers (safe to call twice)."""
        self._pool.close()
