"""The models a model's fields hold, for building validators inside out: each inner model's before the model
that holds it, which then uses each one's schema as it is (kiro.store.config's `_build`).

Built from the top (pydantic's own way, on first use), the outer model's schema holds each inner model's
schema made anew, and an inner model used on its own later makes its schema once more (issue #41).

And the `default_factory` of every model's field that starts empty (`empty_list`, `empty_dict`, `made`): pydantic
reads a factory's signature as it builds a model, which for a builtin (`list`, `dict`) is parsed from its text
signature by the tokenizer (~1.5 M instructions each, and 13 M for the tokenizer's pattern the first time), and
for a model class is made from all its fields (issue #41: a third of building the state's validators at a start).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar, get_args

from pydantic import BaseModel

_M = TypeVar("_M", bound=BaseModel)


def empty_list() -> list[Any]:
    """An empty list, as `default_factory` (not `list`: the module's docstring says why)."""
    return []


def empty_dict() -> dict[str, Any]:
    """An empty dict, as `default_factory` (not `dict`: the module's docstring says why)."""
    return {}


def made(model: type[_M]) -> Callable[[], _M]:
    """A `default_factory` that makes a model with its defaults (not the class itself: the module's docstring
    says why)."""
    def make() -> _M:
        return model()
    return make


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
