"""Per-process services that every loop of a workspace shares (the file watcher, the dashboard
writer): one per workspace and event loop, made by the first loop that asks, closed by the last."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar


class Service(Protocol):
    users: int

    async def aclose(self) -> None: ...


S = TypeVar("S", bound=Service)


class Registry(Generic[S]):
    def __init__(self) -> None:
        self._items: dict[tuple[int, str], S] = {}

    def acquire(self, root: object, make: Callable[[], S]) -> S:
        key = (id(asyncio.get_running_loop()), str(root))
        item = self._items.get(key)
        if item is None:
            item = self._items[key] = make()
        item.users += 1
        return item

    async def release(self, item: S) -> None:
        item.users -= 1
        if item.users > 0:
            return
        for key, value in list(self._items.items()):
            if value is item:
                del self._items[key]
        await item.aclose()
