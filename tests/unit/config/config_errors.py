"""How the config tests read a refusal: the ConfigError that validate_config raises."""

import pytest

from nemo_opd.config import ConfigError, validate_config


def error_of(config) -> str:
    """The message of the ConfigError validate_config raises for `config` (which must fail)."""
    with pytest.raises(ConfigError) as caught:
        validate_config(config)
    return str(caught.value)


def problems(config) -> list[str]:
    """The problem lines of the ConfigError raised for `config` ([] if it is valid)."""
    try:
        validate_config(config)
    except ConfigError as error:
        lines = str(error).splitlines()
        return [line.strip() for line in (lines[1:] if len(lines) > 1 else lines)]
    return []
