"""The command line of a short tiny run, as the functional modules make it: a few steps of 8
prompts x 2 samples, small batches and generations, no validation and no checkpoints unless the
test's own overrides (after these, so they win) ask for them; logs under the run's directory."""

from pathlib import Path

LOCKSTEP = ("distillation.max_staleness=0", "policy.generation.logprob_check_period=null")
"""Overrides for a run of distillation_tiny.yaml (which overlaps, checking the refit every 50th
step) in lockstep, each step checked."""


GENERATION_AUTO = "policy.generation.backend=auto"
"""The generation engine these runs test: vLLM where it is installed (the tiny default itself
generates with the transformers backend; test_transformers_generation_tiny runs it as shipped,
and a test's own overrides, after this, choose another)."""


def short_run_args(
    config: Path, run_dir: Path, steps: int, *extra: str, checkpoint_dir: Path | None = None
) -> list[str]:
    """Arguments of nemo_opd.cli.main for `steps` steps of `config`; checkpointing.checkpoint_dir
    is run_dir/checkpoints unless given."""
    return [
        "--config",
        str(config),
        f"distillation.max_num_steps={steps}",
        "distillation.num_prompts_per_step=8",
        "distillation.num_generations_per_prompt=2",
        "distillation.val_at_start=false",
        "distillation.val_at_end=false",
        "distillation.val_period=0",
        "policy.train_global_batch_size=16",
        "policy.train_micro_batch_size=8",
        "policy.generation.max_new_tokens=16",
        "checkpointing.enabled=false",
        f"checkpointing.checkpoint_dir={checkpoint_dir or run_dir / 'checkpoints'}",
        f"logger.log_dir={run_dir / 'logs'}",
        "logger.console_progress=false",
        GENERATION_AUTO,
        *extra,
    ]
