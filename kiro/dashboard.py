"""`Dashboard.md`, regenerated as loops change state: at most once a second per workspace and
process, however many loops run in it, and once more when the last of them ends.

Loops of this process hand over their live state; the states of other processes' loops are read
from disk (running vs interrupted told by their locks).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

from kiro import reports
from kiro.shared import Registry
from kiro.state import LoopState, StateStore, atomic_write, effective_status
from kiro.workspace import Workspace

MIN_INTERVAL = 1.0


def render(ws: Workspace, store: StateStore, live: dict[str, LoopState]) -> str:
    loops: list[tuple[LoopState, str]] = []
    seen: set[str] = set()
    for tid, st in live.items():
        loops.append((st, st.status))
        seen.add(tid)
    for _path, found in store.all_states(skip=seen):
        if found is None:
            continue
        st = found
        alive = store.is_locked(st.task_id) if st.status in ("running", "sleeping", "pending") else False
        loops.append((st, effective_status(st, alive)))
    loops.sort(key=lambda pair: pair[0].updated_at, reverse=True)
    return reports.dashboard(loops)


def write_now(ws: Workspace, store: StateStore, live: dict[str, LoopState] | None = None) -> None:
    atomic_write(ws.dashboard, render(ws, store, live or {}), fsync=False)


class DashboardService:
    def __init__(self, ws: Workspace, store: StateStore) -> None:
        self.ws = ws
        self.store = store
        self.live: dict[str, LoopState] = {}
        self.users = 0
        self._dirty = False
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None
        self.error: str | None = None

    def update(self, state: LoopState) -> None:
        self.live[state.task_id] = state
        self._dirty = True
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._writer())

    def forget(self, state: LoopState) -> None:
        """A loop of this process ended: from now on its state is read from disk."""
        self.live.pop(state.task_id, None)
        self._dirty = True

    async def _writer(self) -> None:
        while self._dirty:
            wait = self._last + MIN_INTERVAL - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self.flush()

    def flush(self) -> None:
        if not self._dirty:
            return
        self._dirty = False
        self._last = time.monotonic()
        try:
            write_now(self.ws, self.store, self.live)
        except OSError as exc:
            self.error = str(exc)

    async def aclose(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self._dirty = True
        self.flush()


_services: Registry[DashboardService] = Registry()


def acquire(ws: Workspace, store: StateStore) -> DashboardService:
    return _services.acquire(ws.root, lambda: DashboardService(ws, store))


async def release(svc: DashboardService) -> None:
    await _services.release(svc)
