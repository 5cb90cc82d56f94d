"""Where the run executes, what it logs, and what it saves."""

from typing import Literal

from pydantic import Field

from nemo_opd.config.base import Section


class WandbConfig(Section):
    """Weights & Biases run settings."""

    project: str = Field("nemo-opd", min_length=1)
    """W&B project."""

    name: str | None = None
    """W&B run name; null lets W&B pick one."""

    mode: Literal["online", "offline", "disabled"] = "online"
    """online uploads as it goes, offline writes locally for a later `wandb sync`."""


class LoggerConfig(Section):
    """Metrics and rollout logging."""

    log_dir: str = Field("logs", min_length=1)
    """Directory for metrics (JSONL), TensorBoard events and rollout dumps."""

    console_progress: bool = True
    """Show a live progress display and per-step metrics on the console."""

    jsonl_enabled: bool = True
    """Append every step's metrics to log_dir/metrics.jsonl."""

    tensorboard_enabled: bool = False
    """Write TensorBoard event files under log_dir."""

    wandb_enabled: bool = False
    """Log to Weights & Biases."""

    wandb: WandbConfig = Field(default_factory=WandbConfig)
    """W&B settings, used when wandb_enabled."""

    num_rollouts_to_log: int = Field(2, ge=0)
    """Rollouts (prompt, response, reward) printed and logged each step."""

    rollout_dump_period: int = Field(0, ge=0)
    """Write every rollout of a step to log_dir/rollouts/ every this many steps; 0 never."""


class ClusterConfig(Section):
    """The workers that train and generate."""

    num_nodes: int = Field(1, gt=0)
    """Nodes in the cluster."""

    gpus_per_node: int = Field(1, gt=0)
    """Worker processes per node: one per GPU, or CPU worker processes when device is cpu."""

    device: Literal["auto", "cuda", "cpu"] = "auto"
    """cuda, cpu, or auto (cuda when a GPU is visible, else cpu)."""

    cpus_per_worker: int = Field(1, gt=0)
    """CPU cores reserved per worker process."""

    @property
    def world_size(self) -> int:
        """Worker processes in the whole cluster."""
        return self.num_nodes * self.gpus_per_node


class CheckpointingConfig(Section):
    """Periodic checkpoints of the student (weights, optimizer, data position)."""

    enabled: bool = True
    """Save checkpoints."""

    checkpoint_dir: str = Field("results/distillation", min_length=1)
    """Directory holding one subdirectory per saved step."""

    save_period: int = Field(10, gt=0)
    """Save every save_period steps (and after the last step)."""

    keep_top_k: int | None = Field(3, ge=0)
    """Keep the best keep_top_k checkpoints by metric_name (at least 1 when enabled); null
    keeps all."""

    metric_name: str | None = "validation/accuracy"
    """Metric that ranks checkpoints; null ranks by step (the most recent are kept)."""

    higher_is_better: bool = True
    """Whether a higher metric_name is better."""
