"""Metrics and rollout logging, fanned out to JSONL, TensorBoard, W&B and the console.

Layout under LoggerConfig.log_dir:
    metrics.jsonl            one {"step": N, "<metric>": value, ...} object per log() call
    run_config.json          the resolved run config, when one is given
    tensorboard/             TensorBoard event files (tensorboard_enabled)
    rollouts/step_<N>.jsonl  every rollout of step N (every rollout_dump_period steps)

Resuming at step N (resume_step=N) first drops everything logged after step N, from
metrics.jsonl and from TensorBoard, so the repeated steps are not recorded twice.

No secret reaches any of them (nemo_opd.secrets): the run config is redacted before it is
written, and W&B records nothing of the process on its own (WANDB_SETTINGS: W&B saves the
command line by default, and an override can hold a password).
"""

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from nemo_opd.config import LoggerConfig, WandbConfig
from nemo_opd.secrets import redact, redact_text
from nemo_opd.utils.checkpoint import atomic_file
from nemo_opd.utils.console import StepConsole

METRICS_FILE = "metrics.jsonl"
RUN_CONFIG_FILE = "run_config.json"
ROLLOUT_DIR = "rollouts"
TENSORBOARD_DIR = "tensorboard"


def finite_or_none(value: Any) -> float | None:
    """A metric value as a float, None when it is NaN or infinite (JSON has no NaN)."""
    number = float(value)
    return number if math.isfinite(number) else None


def clean_metrics(metrics: Mapping[str, Any]) -> dict[str, float | None]:
    """Every metric as a finite float or None; a value that is not a number is an error."""
    cleaned = {}
    for key, value in metrics.items():
        try:
            cleaned[key] = finite_or_none(value)
        except (TypeError, ValueError) as error:
            raise TypeError(f"metric {key!r} is not a number: {value!r}") from error
    return cleaned


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSONL file, skipping lines that do not parse (a crash can leave a
    half-written last line)."""
    records = []
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(record, dict):
                records.append(record)
    return records


def write_jsonl(path: Path, records: Sequence[Mapping[str, Any]]) -> None:
    """Write records as JSONL atomically: readers see the old file or the complete new one."""
    with atomic_file(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        for record in records:
            handle.write(json.dumps(record, default=str) + "\n")


def truncate_metrics(path: Path, last_step: int) -> None:
    """Drop the records of steps after last_step (and unreadable lines) from a metrics file."""
    if path.exists():
        kept = [r for r in read_jsonl(path) if isinstance(r.get("step"), int)]
        write_jsonl(path, [r for r in kept if r["step"] <= last_step])


def verbatim(text: str) -> str:
    """Indent every line by four spaces so TensorBoard's markdown shows the text as is."""
    return "    " + text.replace("\n", "\n    ")


class Backend(Protocol):
    """One destination for metrics."""

    def log(self, metrics: dict[str, float | None], step: int) -> None: ...

    def log_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlBackend:
    """Appends one JSON line per step to metrics.jsonl, flushed so a crash loses nothing."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        if resume_step is not None:
            truncate_metrics(path, resume_step)
        self._handle = open(path, "a", encoding="utf-8")  # noqa: SIM115 (closed in close())

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        self._handle.write(json.dumps({"step": step, **metrics}) + "\n")
        self._handle.flush()

    def log_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """Rollouts go to their own files (Logger.dump_rollouts), not to the metrics file."""

    def close(self) -> None:
        self._handle.close()


class TensorBoardBackend:
    """Scalars per step, the run config and sample rollouts as text."""

    def __init__(self, log_dir: Path, resume_step: int | None, run_config: dict | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # slow import: only when enabled

        # purge_step hides events at or after it that a crashed run wrote past its checkpoint.
        purge_step = None if resume_step is None else resume_step + 1
        self._writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step)
        if run_config is not None:
            text = verbatim(json.dumps(run_config, indent=2, default=str))
            self._writer.add_text("run_config", text, global_step=0)

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        for key, value in metrics.items():
            if value is not None:
                self._writer.add_scalar(key, value, global_step=step)
        self._writer.flush()

    def log_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        blocks = [
            f"reward {r.get('reward')}\n\n"
            + verbatim(f"prompt:\n{r.get('prompt', '')}\n\nresponse:\n{r.get('response', '')}")
            for r in records
        ]
        self._writer.add_text("rollouts", "\n\n---\n\n".join(blocks), global_step=step)

    def close(self) -> None:
        self._writer.close()


def import_wandb() -> Any:
    """Import wandb, with an actionable message when it is not installed (it is optional)."""
    try:
        import wandb
    except ImportError as error:
        raise ImportError(
            "logger.wandb_enabled=true but the wandb package is not installed: "
            "`pip install wandb`, or set logger.wandb_enabled=false"
        ) from error
    return wandb


WANDB_SETTINGS = {
    "x_disable_meta": True,  # the run's metadata holds sys.argv: overrides, secrets among them
    "disable_git": True,  # a remote's URL can hold a token
    "save_code": False,
    "disable_job_creation": True,  # a job records sys.argv too
}
"""wandb.Settings of every run: W&B records nothing of the process beyond what the logger gives
it (the redacted run config, metrics, rollouts), so no secret reaches its run file."""


class WandbBackend:
    """Logs to a Weights & Biases run (online, or offline for a later `wandb sync`)."""

    def __init__(self, cfg: WandbConfig, log_dir: Path, run_config: dict | None) -> None:
        self._wandb = import_wandb()
        self._run = self._wandb.init(
            project=redact_text(cfg.project),
            name=None if cfg.name is None else redact_text(cfg.name),
            mode=cfg.mode,
            config=run_config,
            dir=str(log_dir),
            settings=self._wandb.Settings(**WANDB_SETTINGS),
        )

    def log(self, metrics: dict[str, float | None], step: int) -> None:
        self._run.log({k: v for k, v in metrics.items() if v is not None}, step=step)

    def log_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        columns = ["prompt", "response", "reward"]
        data = [
            [str(r.get("prompt", "")), str(r.get("response", "")), r.get("reward")] for r in records
        ]
        self._run.log({"rollouts": self._wandb.Table(columns=columns, data=data)}, step=step)

    def close(self) -> None:
        self._run.finish()


class Logger:
    """Fans metrics and rollouts out to the enabled backends and the console."""

    def __init__(
        self,
        cfg: LoggerConfig,
        *,
        run_config: dict | None = None,
        resume_step: int | None = None,
        total_steps: int | None = None,
        console: StepConsole | None = None,
    ) -> None:
        """run_config: the resolved config, recorded with the run, redacted first
        (nemo_opd.secrets: no secret reaches the file, TensorBoard or W&B); resume_step:
        last step of the checkpoint being resumed (later records are dropped), None for a new
        run that appends; total_steps: for the progress bar; console: replaces the default
        one."""
        self.cfg = cfg
        self.log_dir = Path(cfg.log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if run_config is not None:
            run_config = redact(run_config)
            with atomic_file(self.log_dir / RUN_CONFIG_FILE) as tmp:
                tmp.write_text(json.dumps(run_config, indent=2, default=str), encoding="utf-8")
        self._backends: list[Backend] = []
        if cfg.jsonl_enabled:
            self._backends.append(JsonlBackend(self.log_dir / METRICS_FILE, resume_step))
        if cfg.tensorboard_enabled:
            tb_dir = self.log_dir / TENSORBOARD_DIR
            self._backends.append(TensorBoardBackend(tb_dir, resume_step, run_config))
        if cfg.wandb_enabled:
            self._backends.append(WandbBackend(cfg.wandb, self.log_dir, run_config))
        self._rollouts_shown = False
        self.console = console or StepConsole(
            total_steps, progress=cfg.console_progress, start_step=resume_step or 0
        )

    def log(self, metrics: Mapping[str, Any], step: int) -> None:
        """Record one step's metrics (numbers; NaN/inf are kept as null/skipped)."""
        cleaned = clean_metrics(metrics)
        for backend in self._backends:
            backend.log(cleaned, step)
        self.console.update(step, cleaned)

    def log_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> None:
        """Show and log the first num_rollouts_to_log rollouts ({"prompt", "response",
        "reward", ...}) at this logger's first step and every rollouts_log_period steps; every
        rollout_dump_period steps also dump all of them to a file."""
        samples = list(records[: self.cfg.num_rollouts_to_log]) if self._shows(step) else []
        if samples:
            for backend in self._backends:
                backend.log_rollouts(samples, step)
            self.console.print_rollouts(samples, step)
        period = self.cfg.rollout_dump_period
        if period and step % period == 0:
            self.dump_rollouts(records, step)

    def _shows(self, step: int) -> bool:
        """Whether sample rollouts are shown at `step` (see log_rollouts)."""
        period = self.cfg.rollouts_log_period
        first, self._rollouts_shown = not self._rollouts_shown, True
        return bool(period) and (first or step % period == 0)

    def dump_rollouts(self, records: Sequence[Mapping[str, Any]], step: int) -> Path:
        """Write every record to log_dir/rollouts/step_<step>.jsonl atomically; returns it."""
        path = self.log_dir / ROLLOUT_DIR / f"step_{step}.jsonl"
        write_jsonl(path, records)
        return path

    def close(self) -> None:
        """Flush and close every backend and stop the console display."""
        self.console.close()
        for backend in self._backends:
            backend.close()
        self._backends = []

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
