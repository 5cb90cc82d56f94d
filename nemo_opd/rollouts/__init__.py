"""Rollouts: the student's conversations with the environments."""

from nemo_opd.rollouts.multi_turn import RolloutResult, rollout_metrics, run_multi_turn_rollout

__all__ = ["RolloutResult", "rollout_metrics", "run_multi_turn_rollout"]
