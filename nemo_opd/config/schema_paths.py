"""Look up the schema by key path: which keys a section accepts, whether a path exists."""

import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The section model inside a field annotation (`X`, `X | None`), or None for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        models = [section_model(arg) for arg in typing.get_args(annotation)]
        models = [model for model in models if model is not None]
        return models[0] if len(models) == 1 else None
    return None


def model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model reached by following `path` from `root`, or None if it is not one."""
    model: type[BaseModel] | None = root
    for part in path:
        if model is None or not isinstance(part, str) or part not in model.model_fields:
            return None
        model = section_model(model.model_fields[part].annotation)
    return model


def keys_at(root: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys the section at `path` accepts ([] if `path` is not a section)."""
    model = model_at(root, path)
    return list(model.model_fields) if model is not None else []


def has_path(root: type[BaseModel], path: Sequence[str]) -> bool:
    """Whether `path` (e.g. ["policy", "optimizer", "lr"]) names a key in the schema."""
    *parents, last = path
    return last in keys_at(root, parents)
