"""Resuming a run: the newest checkpoint of checkpointing.checkpoint_dir that verifies, loaded
into the run setup() built (the student's weights and training state, the prompt loader, the
step, and with max_staleness > 0 the rollouts sampled ahead of it)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from nemo_opd.rollouts import rollout_from_state

if TYPE_CHECKING:
    from nemo_opd.algorithms.run_state import DistillationRun

ROLLOUTS_AHEAD_FILE = "rollouts_ahead.pt"
"""In a checkpoint of step k with max_staleness s > 0: the rollouts of steps k+1..k+s."""
ROLLOUTS_AHEAD_KEY = "rollouts_ahead"
"""The checkpoint state's list of the steps whose rollouts ROLLOUTS_AHEAD_FILE holds."""


def restore_latest(state: DistillationRun) -> None:
    """Load the newest checkpoint of checkpointing.checkpoint_dir that verifies, if any; newer
    ones that do not are set aside under unreadable/ and reported. (setup's _claim_directories
    found them this run's; the checkpoints it saves record its identity.)"""
    state.checkpoints.identity = state.lock.identity
    if not state.cfg.checkpointing.enabled:
        return
    point = state.checkpoints.resume_point()
    for moved, reason in point.set_aside:
        print(f"checkpoint not resumable, set aside as {moved}: {reason}")
    if point.path is None:
        return
    path = point.path
    saved = state.checkpoints.load_state(path)
    state.student.load(str(path / "policy"))
    state.loader.load_state_dict(saved["state"]["loader"])
    state.loader_position = saved["state"]["loader"]
    state.step = state.resumed_step = int(saved["step"])
    if saved["state"].get(ROLLOUTS_AHEAD_KEY):
        ahead = torch.load(path / ROLLOUTS_AHEAD_FILE, weights_only=True)
        state.saved_rollouts = {int(s): rollout_from_state(r) for s, r in ahead.items()}
    state.generation_version = -1  # vLLM holds the initial weights: refit before sampling
    state.last_metrics = dict(saved.get("metrics", {}))
    print(f"resumed from {path} (step {state.step})")
    if state.step >= (steps := state.cfg.distillation.max_num_steps):
        print(f"nothing to train: step {state.step} >= {steps}; exporting that step's model")
