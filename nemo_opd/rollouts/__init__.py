"""Rollouts: the student's conversations with the environments."""

from nemo_opd.rollouts.multi_turn import (
    RolloutResult,
    concat_rollouts,
    rollout_from_state,
    rollout_metrics,
    rollout_state,
    run_multi_turn_rollout,
)

__all__ = [
    "RolloutResult",
    "concat_rollouts",
    "rollout_from_state",
    "rollout_metrics",
    "rollout_state",
    "run_multi_turn_rollout",
]
