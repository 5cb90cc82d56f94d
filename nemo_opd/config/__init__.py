"""Configuration: YAML files with `defaults:` inheritance, `${...}` interpolation, Hydra's
command-line overrides, and a strict pydantic schema with one model per section.

    cfg = load_config("examples/configs/distillation_tiny.yaml", ["loss_fn.kl_type=forward"])
    policy = Policy(cfg.policy)          # each component receives only its own section
    print(to_yaml(cfg))                  # the fully resolved, validated config

Modules: schema.py and model_schema.py (the sections; section.py their base and size bounds),
loader.py (reading, inheritance, validation, dumping), overrides.py (Hydra's grammar),
interpolation.py (`${...}`), bounds.py (loading's limits), checks.py (the cross-field rules,
a few beside what they use: address.py, templates.py, worker_split.py), key_paths.py (the
schema by key path), errors.py (ConfigError and its messages). Below config/: the redaction
of secrets (nemo_opd.secrets) and the converter's NeMo-RL key map, which the hints on NeMo-RL's
keys read (nemo_opd.nemo_rl_keys); above it, the generator of docs/config.md's key tables
(nemo_opd.config_reference).

Every problem is raised as ConfigError with a message naming the full key path.
"""

from nemo_opd.config.errors import ConfigError
from nemo_opd.config.interpolation import register_resolvers
from nemo_opd.config.loader import compose_config, load_config, to_dict, to_yaml, validate_config
from nemo_opd.config.model_schema import (
    ColocatedConfig,
    DTensorConfig,
    DynamicBatchingConfig,
    GenerationConfig,
    LoraConfig,
    MegatronConfig,
    OptimizerConfig,
    PolicyConfig,
    ResourcesConfig,
    SchedulerConfig,
    SequencePackingConfig,
    TeacherConfig,
    TeacherServerConfig,
    TokenizerConfig,
    TransformersConfig,
    VllmConfig,
)
from nemo_opd.config.overrides import apply_overrides, parse_override
from nemo_opd.config.schema import (
    CheckpointingConfig,
    ClusterConfig,
    DataConfig,
    DistillationConfig,
    DistillationLoopConfig,
    EnvConfig,
    LoggerConfig,
    LossConfig,
    MathEnvConfig,
    ToolsConfig,
    WandbConfig,
)

__all__ = [
    "CheckpointingConfig",
    "ClusterConfig",
    "ColocatedConfig",
    "ConfigError",
    "DTensorConfig",
    "DataConfig",
    "DistillationConfig",
    "DistillationLoopConfig",
    "DynamicBatchingConfig",
    "EnvConfig",
    "GenerationConfig",
    "LoggerConfig",
    "LoraConfig",
    "LossConfig",
    "MathEnvConfig",
    "MegatronConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "TeacherConfig",
    "TeacherServerConfig",
    "ResourcesConfig",
    "SchedulerConfig",
    "SequencePackingConfig",
    "TokenizerConfig",
    "ToolsConfig",
    "TransformersConfig",
    "VllmConfig",
    "WandbConfig",
    "apply_overrides",
    "compose_config",
    "load_config",
    "parse_override",
    "register_resolvers",
    "to_dict",
    "to_yaml",
    "validate_config",
]
