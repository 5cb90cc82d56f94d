"""Environments that grade rollouts: the interface and the math answer-verification environment."""

from nemo_opd.environments.base import Environment, EnvironmentStep
from nemo_opd.environments.math_env import MathEnvironment
from nemo_opd.environments.math_verify import answers_equivalent, extract_answer, verify

__all__ = [
    "Environment",
    "EnvironmentStep",
    "MathEnvironment",
    "answers_equivalent",
    "extract_answer",
    "verify",
]
