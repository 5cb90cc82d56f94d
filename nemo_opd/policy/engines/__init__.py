"""Engines: the shared training/scoring algorithms (base.Engine) and the backends."""

ENGINE_MODULES = {
    "dtensor": "nemo_opd.policy.engines.dtensor",
    "megatron": "nemo_opd.policy.engines.megatron",
}
"""The module of each backend's engine (PolicyConfig.backend): what a rank of it imports."""
