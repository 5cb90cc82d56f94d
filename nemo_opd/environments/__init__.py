"""Environments that grade rollouts: the interface and the math answer-verification environment.

MathEnvironment is imported on first use: grader workers import this package for its graders
alone, and the environment's imports (the config schema, torch through the message log) would
add seconds to each worker's start."""

from nemo_opd.environments.base import Environment, EnvironmentStep
from nemo_opd.environments.builtin_grader import answers_equivalent, extract_answer
from nemo_opd.environments.math_verify import GRADERS, verify

__all__ = [
    "GRADERS",
    "Environment",
    "EnvironmentStep",
    "MathEnvironment",
    "answers_equivalent",
    "extract_answer",
    "verify",
]


def __getattr__(name: str):
    if name == "MathEnvironment":
        from nemo_opd.environments.math_env import MathEnvironment

        return MathEnvironment
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
