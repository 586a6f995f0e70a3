"""kiro's stored models build their validators when first used (pydantic's `defer_build`), inside out: the
models a model's fields hold before the model itself, which then uses each one's schema as it is.

Built from the top, pydantic makes the schema of every model inside again as part of the outer one's, and
once more when the inner model is first used on its own (a loop's state is made, then a `CompletedStep`, a
`Receipt`, a `Context()` default): about 7 ms of every `kiro loop start` and `resume` (issue #41).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel, ConfigDict


def inner_types(annotation: Any) -> Iterator[Any]:
    """An annotation and every type inside it (`list[CompletedStep] | None`: each of them, however deep)."""
    yield annotation
    for arg in get_args(annotation):
        yield from inner_types(arg)


def models_within(model: type[BaseModel], seen: set[type[BaseModel]] | None = None) -> Iterator[type[BaseModel]]:
    """Every model `model`'s fields hold, however deep (`list[CompletedStep]`, `Receipt | None`, a dict's
    values), each before the model that holds it, then `model`."""
    seen = set() if seen is None else seen
    seen.add(model)
    for field in model.model_fields.values():
        for inner in inner_types(field.annotation):
            if isinstance(inner, type) and issubclass(inner, BaseModel) and inner not in seen:
                yield from models_within(inner, seen)
    yield model


class InsideOut(BaseModel):
    """A model whose validator is built when it is first used, after those of the models its fields hold."""

    model_config = ConfigDict(defer_build=True)

    @classmethod
    def model_rebuild(cls, *, force: bool = False, raise_errors: bool = True, _parent_namespace_depth: int = 2,
                      _types_namespace: Any = None) -> bool | None:
        if not cls.__pydantic_complete__:
            for inner in models_within(cls):
                if inner is not cls and not inner.__pydantic_complete__:
                    inner.model_rebuild(raise_errors=raise_errors)
        return super().model_rebuild(force=force, raise_errors=raise_errors,
                                     _parent_namespace_depth=_parent_namespace_depth + 1,
                                     _types_namespace=_types_namespace)
