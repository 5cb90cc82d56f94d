"""load_config: YAML file (with `defaults:`) + overrides -> interpolated -> validated config.

The steps, in order:
1. read the file and everything it inherits through `defaults:`, deep-merged;
2. apply the command-line overrides to that merged dict;
3. resolve `${...}` interpolations (so an override changes every value that refers to it);
4. validate against the schema, fields first, then the cross-field checks.
Every failure along the way is a ConfigError.
"""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from nemo_opd.config.inheritance import load_with_defaults
from nemo_opd.config.interpolation import interpolated_keys, resolve_interpolations
from nemo_opd.config.overrides import apply_overrides
from nemo_opd.config.schema import DistillationConfig
from nemo_opd.config.validation import validate_config


def compose_config(path: str | Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Steps 1-3: the merged, overridden and interpolated config as a plain dict (unvalidated)."""
    return resolve_interpolations(_merge_and_override(path, overrides))


def load_config(path: str | Path, overrides: Sequence[str] = ()) -> DistillationConfig:
    """Load, override, interpolate and validate a distillation config file."""
    overridden = _merge_and_override(path, overrides)
    resolved = resolve_interpolations(overridden)
    return validate_config(resolved, interpolations=interpolated_keys(overridden))


def _merge_and_override(path: str | Path, overrides: Sequence[str]) -> dict[str, Any]:
    """Steps 1-2: the file merged with its `defaults:`, then the overrides applied."""
    if isinstance(overrides, str):
        raise TypeError("overrides must be a sequence of strings, not a single string")
    return apply_overrides(load_with_defaults(path), overrides)
