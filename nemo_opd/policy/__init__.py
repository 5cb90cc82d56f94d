"""The Policy facade (train, score, save/load, offload, export weights) and its engines.

See docs/policy.md. `Policy` is imported on first use: the engines (nemo_opd.policy.engines)
build and run in a process without Ray, as a worker or a single-process benchmark builds them.
"""

__all__ = ["Policy"]


def __getattr__(name: str):
    if name == "Policy":
        from nemo_opd.policy.policy import Policy

        return Policy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
