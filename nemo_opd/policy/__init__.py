"""The Policy facade (train, score, save/load, offload, export weights) and its engines.

See docs/policy.md.
"""

from nemo_opd.policy.policy import Policy

__all__ = ["Policy"]
