"""Configuration: YAML files with `defaults:` inheritance, `${...}` interpolation, Hydra-style
command-line overrides, and a strict pydantic schema with one model per section.

    cfg = load_config("examples/configs/distillation_tiny.yaml", ["loss_fn.kl_type=forward"])
    policy = Policy(cfg.policy)          # each component receives only its own section
    print(to_yaml(cfg))                  # the fully resolved, validated config

Every problem is raised as ConfigError with a message naming the full key path.
"""

from nemo_opd.config.data import DataConfig, EnvConfig, MathEnvConfig
from nemo_opd.config.dump import to_dict, to_yaml
from nemo_opd.config.errors import ConfigError
from nemo_opd.config.generation import (
    ColocatedConfig,
    GenerationConfig,
    ResourcesConfig,
    VllmConfig,
)
from nemo_opd.config.interpolation import register_resolvers
from nemo_opd.config.loader import compose_config, load_config
from nemo_opd.config.loop import DistillationLoopConfig
from nemo_opd.config.loss import LossConfig
from nemo_opd.config.overrides import apply_overrides, parse_override
from nemo_opd.config.parallelism import (
    DTensorConfig,
    DynamicBatchingConfig,
    MegatronConfig,
    SequencePackingConfig,
)
from nemo_opd.config.policy import (
    OptimizerConfig,
    PolicyConfig,
    SchedulerConfig,
    TokenizerConfig,
)
from nemo_opd.config.runtime import (
    CheckpointingConfig,
    ClusterConfig,
    LoggerConfig,
    WandbConfig,
)
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.config.validation import validate_config

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
    "LossConfig",
    "MathEnvConfig",
    "MegatronConfig",
    "OptimizerConfig",
    "PolicyConfig",
    "ResourcesConfig",
    "SchedulerConfig",
    "SequencePackingConfig",
    "TokenizerConfig",
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
