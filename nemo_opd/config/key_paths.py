"""Looking the schema up by key path: for overrides, error messages and the reference."""

import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel


def section_model(annotation: Any) -> type[BaseModel] | None:
    """The section model inside a field annotation (`X`, `X | None`), or None for a leaf."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    models = [section_model(arg) for arg in _union_members(annotation)]
    models = [model for model in models if model is not None]
    return models[0] if len(models) == 1 else None


def mapping_value(annotation: Any) -> Any:
    """V of a `dict[str, V]` field (`teachers`, `data.teacher_routes`), else None: a mapping
    whose keys the user names."""
    for member in (annotation, *_union_members(annotation)):
        if typing.get_origin(member) is dict:
            return typing.get_args(member)[1]
    return None


def _union_members(annotation: Any) -> tuple:
    """The members of `X | Y` (or `Optional[X]`); () for anything else."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return ()


def _annotation_at(root: type[BaseModel], path: Sequence[str | int]) -> tuple[bool, Any]:
    """(found, the annotation of what `path` names): a field's, or a mapping's value type for a
    user-named key under a mapping (`teachers.math`); (False, None) for no such path."""
    annotation: Any = root
    for part in path:
        model = section_model(annotation)
        value = mapping_value(annotation)
        if not isinstance(part, str):
            return False, None
        if value is not None:
            annotation = value  # any name: the mapping's keys are the user's
        elif model is not None and part in model.model_fields:
            annotation = model.model_fields[part].annotation
        else:
            return False, None
    return True, annotation


def model_at(root: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The section model reached by following `path` from `root`, or None if it is not one
    (a key under a mapping of sections, `teachers.math`, reaches the entries' model)."""
    found, annotation = _annotation_at(root, path)
    if not found or mapping_value(annotation) is not None:
        return None
    return section_model(annotation)


def keys_at(root: type[BaseModel], path: Sequence[str | int]) -> list[str]:
    """The keys the section at `path` accepts ([] if `path` is not a section)."""
    model = model_at(root, path)
    return list(model.model_fields) if model is not None else []


def has_path(root: type[BaseModel], path: Sequence[str]) -> bool:
    """Whether `path` (e.g. ["policy", "optimizer", "lr"], or ["teachers", "math"]: any key of
    a mapping) names a key in the schema."""
    return _annotation_at(root, path)[0]
