"""Reacting to files without polling: one watcher per workspace per process, over the folders
people use to steer loops (`.hooks/`, `Specs/`, `Done/`, `Needs_Action/`): inotify read on the event
loop itself (kiro.inotify) on Linux, else a watchfiles watcher (a thread).

Every change batch wakes every subscribed waiter; a waiter then re-checks its own conditions (a few
`stat` calls). While nothing changes, waiting costs no CPU: the watcher blocks in the kernel.
If the OS watcher cannot start (inotify limits, an unsupported filesystem), waiters fall back to
checking every POLL_FALLBACK seconds and a warning says so.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kiro import ownwrites
from kiro.shared import Registry

POLL_FALLBACK = 0.25
SAFETY_POLL = 5.0
WATCHED = (".hooks", "Specs", "Done", "Needs_Action", ".state/inbox")  # inbox: messages wake waiting loops



def _relevant(change: object, path: str) -> bool:
    """watchfiles' filter: a change that is not kiro's own (`kiro.ownwrites`)."""
    return not ownwrites.is_own_change(path)


class ChangeHub:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._waiters: set[asyncio.Event] = set()
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self._ready: asyncio.Event | None = None
        self.failed: str | None = None
        self.users = 0
        self._inotify: Any = None  # kiro.inotify.Inotify, when it could start

    def subscribe_event(self, ev: asyncio.Event) -> None:
        self._waiters.add(ev)

    def unsubscribe(self, ev: asyncio.Event) -> None:
        self._waiters.discard(ev)

    def notify(self) -> None:
        for ev in list(self._waiters):
            ev.set()

    @property
    def poll_interval(self) -> float:
        """How often a waiter re-checks on its own: rarely while the OS watcher runs (a safety net,
        one `stat` every few seconds), often when it could not start."""
        running = self._task is not None or self._inotify is not None
        return POLL_FALLBACK if self.failed is not None or not running else SAFETY_POLL

    async def start(self, *, wait_ready: bool = True) -> None:
        """Start watching. With `wait_ready`, give the watcher up to 0.1 s to set up first (a
        supervisor that lives long); a loop passes False: it re-checks its conditions at every
        iteration anyway, and the wait would be a fixed cost of every run (bench/startup.py)."""
        if self._task is not None or self._inotify is not None:
            return
        paths = []
        for name in WATCHED:
            p = self.root / name
            with contextlib.suppress(OSError):
                p.mkdir(parents=True, exist_ok=True)
            if p.is_dir():
                paths.append(p)
        self._stop = asyncio.Event()
        self._ready = asyncio.Event()
        if self._start_inotify(paths):
            return
        self._task = asyncio.create_task(self._run(paths), name=f"kiro-watch:{self.root}")
        if not wait_ready:
            return
        # Give the watcher a moment to set up its inotify watches. A change it misses in this
        # window is still seen: every loop re-checks at each iteration, and waiters re-check at least
        # every SAFETY_POLL seconds.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._ready.wait(), 0.1)

    def _start_inotify(self, paths: list[Path]) -> bool:
        """Watch with inotify on the event loop (kiro.inotify); False where it cannot start."""
        from kiro.inotify import Inotify

        try:
            self._inotify = Inotify(paths, self._changed)
        except OSError:
            return False
        self._inotify.start(asyncio.get_running_loop())
        self._ready.set()  # type: ignore[union-attr]
        return True

    def _changed(self, paths: list[str]) -> None:
        if any(not ownwrites.is_own_change(p) for p in set(paths)):
            self.notify()

    async def _run(self, paths: list[Path]) -> None:
        try:
            from watchfiles import awatch

            assert self._stop is not None and self._ready is not None
            watcher = awatch(*paths, debounce=50, step=5, stop_event=self._stop, rust_timeout=1000,
                             yield_on_timeout=True, watch_filter=_relevant, recursive=True,
                             ignore_permission_denied=True)
            async for changes in watcher:
                self._ready.set()
                if changes:
                    self.notify()
        except Exception as exc:  # the watcher is an optimisation; waiters fall back to polling
            self.failed = f"{type(exc).__name__}: {exc}"
            self.notify()
        finally:
            if self._ready is not None:
                self._ready.set()

    async def aclose(self) -> None:
        if self._inotify is not None:
            self._inotify.close()
            self._inotify = None
        if self._task is None:
            return
        assert self._stop is not None
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._task, 2)
        self._task = None


_hubs: Registry[ChangeHub] = Registry()


async def acquire_hub(root: Path, *, wait_ready: bool = True) -> ChangeHub:
    """The workspace's hub for the running event loop, shared by every loop in this process."""
    hub = _hubs.acquire(root, lambda: ChangeHub(root))
    await hub.start(wait_ready=wait_ready)
    return hub


async def release_hub(hub: ChangeHub) -> None:
    await _hubs.release(hub)


async def wait_until(check: Callable[[], object], wake: asyncio.Event, timeout: float | None,
                     poll: float | None) -> object:
    """Wait until `check()` returns something truthy (returned) or the timeout passes (None).
    `wake` is set by the hub on every file change (and by whoever wants the waiter to look again)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        wake.clear()
        result = check()
        if result:
            return result
        remaining = None if deadline is None else deadline - loop.time()
        if remaining is not None and remaining <= 0:
            return None
        step = remaining if poll is None else (poll if remaining is None else min(poll, remaining))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(wake.wait(), step)


def ticks(paths: list[Path], interval: float) -> Iterator[None]:
    """For a live view in the foreground: yield when something changes under `paths`, and at least
    every `interval` seconds (durations move on). Falls back to sleeping when the watcher cannot run."""
    import time

    try:
        from watchfiles import watch

        existing = [p for p in paths if p.exists()]
        if not existing:
            raise FileNotFoundError(paths)
        for _changes in watch(*existing, debounce=50, step=20, rust_timeout=int(interval * 1000),
                              yield_on_timeout=True, watch_filter=None, raise_interrupt=False):
            yield
    except (OSError, RuntimeError):
        while True:
            time.sleep(interval)
            yield
