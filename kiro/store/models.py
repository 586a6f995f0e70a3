"""The models a model's fields hold, for building validators inside out: each inner model's before the model
that holds it, which then uses each one's schema as it is (kiro.store.config's `_build`).

Built from the top (pydantic's own way, on first use), the outer model's schema holds each inner model's
schema made anew, and an inner model used on its own later makes its schema once more (issue #41).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, get_args

from pydantic import BaseModel


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
