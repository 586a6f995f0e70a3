"""Reacting to files without polling: one watchfiles watcher per workspace per process, over the
folders people use to steer loops (`.hooks/`, `Specs/`, `Done/`, `Needs_Action/`, `.state/inbox/`, and
a project's `.kiro/specs/` and the workspace's `Approved/` when they are there). A folder not there yet is
not made (in a Kiro repository a loop makes no `Specs/`, `Done/` or `Needs_Action/` at the project's root;
`.kiro/specs/` is Kiro's, `Approved/` comes with kiro's first note): the workspace's top level, and `.kiro/`
when it is there, are watched alone (not recursively) until it appears, then it is watched too, and every
waiter looks again once its watch is set up (a file made in it before then gives no change).

Every change batch wakes every subscribed waiter; a waiter then re-checks its own conditions (a few
`stat` calls). kiro's own writes wake nobody (`kiro.fs.ownwrites`, as watchfiles' filter). While nothing
changes, waiting costs little CPU: watchfiles' thread looks at what inotify queued every STEP_MS.

The hub watches only for waiters. A loop busy with its steps looks for itself (a few `stat` calls before
each model call, tool call and iteration: SPEC §6), so the watches start with the first waiter
(`subscribe`: a loop's first wait, `kiro loop watch`, an ACP agent's turn), and while nobody waits
watchfiles' thread is held in its stop event's `is_set` and takes no GIL; inotify's own thread keeps
gathering the changes, handed over once a waiter comes back. A waiter looks at its conditions once
subscribed (the watches set up) and at every batch after, so nothing it waits for is missed.

If the watcher cannot start (inotify limits, an unsupported filesystem), waiters fall back to
checking every POLL_FALLBACK seconds and a warning says so.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

from kiro.fs import ownwrites
from kiro.shared import Registry

POLL_FALLBACK = 0.25
SAFETY_POLL = 5.0
WATCHED = (".hooks", "Specs", "Done", "Needs_Action", ".state/inbox")  # inbox: messages wake waiting loops
MADE = (".state/inbox",)  # kiro's own (under the state folder): made when missing; the others are watched once there
# Kiro's spec folders (kiro.store.kirospec); Approved/: a person's approval of a task file a step wrote
# (kiro.store.approval), which wakes `kiro loop watch` (made by the first note: never made here)
WATCHED_IF_THERE = (".kiro/specs", "Approved")
# watchfiles hands a batch over once STEP_MS pass without a new change, or DEBOUNCE_MS after its first:
# a hook dropped is seen in one to two steps (bench/hook_reaction.py). Each step takes the GIL once. The
# top level's watch, there while a folder is missing, steps every DEBOUNCE_MS (a folder that appears is seen
# within ~0.1 s; idle, ~1 ms of CPU a second where every STEP_MS took ~8).
STEP_MS = 5
DEBOUNCE_MS = 50
RUST_TIMEOUT_MS = 5_000  # a watcher whose event loop went away unstopped ends its thread within this
SETUP_SECONDS = 10.0  # at most, for a watch thread to set its watches up (or end)


def _relevant(change: object, path: str) -> bool:
    """watchfiles' filter: a change that is not kiro's own (`kiro.fs.ownwrites`)."""
    return not ownwrites.is_own_change(path)


class ChangeHub:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._waiters: Counter[asyncio.Event] = Counter()  # an event subscribed twice is unsubscribed twice
        self._gates: set[threading.Event] = set()  # a watch thread's: open while there is a waiter
        self._task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[None] | None = None  # the watches' start, by the first subscriber
        self._stop: asyncio.Event | None = None
        self.failed: str | None = None
        self.users = 0
        self._setting_up: set[asyncio.Future[None]] = set()  # the watches not set up yet (`_watched`)

    async def subscribe(self, ev: asyncio.Event) -> None:
        """`ev` is set on every change until `unsubscribe`. The first subscriber starts the watches; returns
        once they are set up, or failed to (`failed`). While the hub has a subscriber its watches step."""
        self._waiters[ev] += 1
        for gate in self._gates:
            gate.set()
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    @contextlib.asynccontextmanager
    async def subscribed(self, ev: asyncio.Event) -> AsyncIterator[None]:
        """Subscribed for the block, also when cancelled while the watches start."""
        try:
            await self.subscribe(ev)  # counted at once, so always taken back
            yield
        finally:
            self.unsubscribe(ev)

    def unsubscribe(self, ev: asyncio.Event) -> None:
        """The last subscriber gone, the watch threads hold still (what changes meanwhile is kept for the next)."""
        if self._waiters[ev] > 1:
            self._waiters[ev] -= 1
        else:
            self._waiters.pop(ev, None)
        if not self._waiters:
            for gate in self._gates:
                gate.clear()

    def notify(self) -> None:
        for ev in list(self._waiters):
            ev.set()

    @property
    def poll_interval(self) -> float:
        """How often a waiter re-checks on its own: rarely while the watcher runs (a safety net,
        one `stat` every few seconds), often when it could not start."""
        return POLL_FALLBACK if self.failed is not None or self._task is None else SAFETY_POLL

    async def _start(self) -> None:
        """Start watching. Returns once the watcher has set up its watches, or failed to (`failed`):
        watchfiles sets them up before its first wait, in the task's first turn."""
        for name in MADE:
            with contextlib.suppress(OSError):
                (self.root / name).mkdir(parents=True, exist_ok=True)
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"kiro-watch:{self.root}")
        for _turn in range(3):  # the watches' first turns (the folders' watch, then the top level's)
            await asyncio.sleep(0)
        if self._setting_up:  # each watch's thread: its watches set up, or it failed
            await asyncio.wait(set(self._setting_up), timeout=SETUP_SECONDS)
            await asyncio.sleep(0)  # a failure is the hub's (`failed`) before this returns

    def _present(self) -> set[str]:
        """The folders watched, and `.kiro` (where `.kiro/specs` appears), that are there now."""
        return {name for name in (*WATCHED, *WATCHED_IF_THERE, ".kiro") if (self.root / name).is_dir()}

    def _paths(self) -> tuple[list[Path], list[Path], bool]:
        """The folders there now; those watched alone while one is missing (the top level, and `.kiro` while
        `.kiro/specs` is missing); and whether one of WATCHED is missing (a Kiro repository's top level)."""
        paths: list[Path] = []
        missing: set[str] = set()
        for name in (*WATCHED, *WATCHED_IF_THERE):  # a project's own folders: watched, never made
            p = self.root / name
            if not p.is_dir():
                missing.add(name)
            elif p.resolve() not in {q.resolve() for q in paths}:
                paths.append(p)
        tops = [self.root] if missing else []
        if ".kiro/specs" in missing and (self.root / ".kiro").is_dir():
            tops.append(self.root / ".kiro")
        return paths, tops, not missing.isdisjoint(WATCHED)

    async def _run(self) -> None:
        assert self._stop is not None
        try:
            while not self._stop.is_set():
                paths, tops, loose = self._paths()
                if not tops:
                    await self._watch(paths, self._stop)
                    return
                again = asyncio.Event()  # a missing folder appeared: watch it as well
                top = asyncio.create_task(self._watch_top(again, tops, self._present(), loose=loose))
                try:
                    await self._watch(paths, again)
                finally:
                    again.set()
                    with contextlib.suppress(BaseException):
                        await top
        except Exception as exc:  # the watcher is an optimisation; waiters fall back to polling
            self.failed = f"{type(exc).__name__}: {exc}"
            self.notify()

    async def _watch(self, paths: list[Path], stop: asyncio.Event) -> None:
        if not paths:
            await stop.wait()
            return
        # set up anew once a folder appeared: what changed before then (its files) is looked at now
        await self._watched(paths, stop, recursive=True, on_change=self.notify, on_ready=self.notify)

    async def _watch_top(self, again: asyncio.Event, tops: list[Path], present: set[str], *, loose: bool) -> None:
        """`tops` (the workspace's top level, `.kiro`), not recursively, while a watched folder is missing: sets
        `again` when one appears (or the hub stops). `loose`: one of WATCHED is missing (a Kiro repository), and
        any change at the top level wakes the waiters too."""
        assert self._stop is not None
        stop = self._stop
        relay = asyncio.create_task(stop.wait())
        relay.add_done_callback(lambda _t: again.set())

        def changed() -> None:
            if loose:
                self.notify()
            appeared()

        def appeared() -> None:  # also a folder made before the watch was set up
            if self._present() != present:
                again.set()

        try:
            await self._watched(tops, again, recursive=False, on_change=changed, on_ready=appeared,
                                step=max(STEP_MS, DEBOUNCE_MS))
        finally:
            relay.cancel()

    async def _watched(self, paths: list[Path], stop: asyncio.Event, *, recursive: bool,
                       on_change: Callable[[], object], on_ready: Callable[[], object] | None = None,
                       step: int | None = None) -> None:
        """watchfiles' `watch` over `paths` on a thread of its own until `stop` is set: `on_change()` runs on
        the event loop for each batch that holds a change not kiro's own. The filter looks first on that
        thread, so kiro's own edits in these folders (a step's box, twice a step) never wake the event loop
        (`awatch` handed every batch to it through anyio). A batch that passes is looked at again on the
        event loop, where kiro notes its own writes, so an edit noted just after the thread's look wakes
        nobody. `on_ready()`: once the watches are set up. `step`: watchfiles' step, STEP_MS unless said. Raises
        what the watch raised (it could not start). While the hub has no subscriber, the thread waits in
        the stop event's `is_set` (watchfiles asks it with the GIL held, between its steps; a
        `threading.Event` wait lets the GIL go), so it neither steps nor takes the GIL: a loop running its
        steps back to back is not interrupted every STEP_MS."""
        from watchfiles import watch

        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        ended: asyncio.Future[object] = loop.create_future()
        self._setting_up.add(ready)
        ready.add_done_callback(self._setting_up.discard)
        if on_ready is not None:
            ready.add_done_callback(lambda _f: on_ready())
        halt = threading.Event()
        gate = threading.Event()  # open while the hub has a subscriber, or once halted
        if self._waiters:
            gate.set()
        self._gates.add(gate)
        asked: list[bool] = []

        class Halt:
            """watchfiles' stop event: asked at each of its steps, from its first wait on (the watches are
            set up by then)."""

            @staticmethod
            def is_set() -> bool:
                if not asked:
                    asked.append(True)
                    _call(loop, _settle, ready, None)
                if not gate.is_set():  # (`wait` on a set gate costs more than the step: a waiting loop's CPU +40%)
                    while not gate.wait(RUST_TIMEOUT_MS / 1000):  # nobody waits: held here, the GIL let go
                        if loop.is_closed():  # its event loop went away unstopped
                            return True
                return halt.is_set()

        def batch(changes: set[tuple[object, str]]) -> None:
            if any(_relevant(change, path) for change, path in changes):
                on_change()

        def run() -> None:
            failure: BaseException | None = None
            try:
                for changes in watch(*paths, watch_filter=_relevant, debounce=DEBOUNCE_MS, step=step or STEP_MS,
                                     stop_event=Halt(), rust_timeout=RUST_TIMEOUT_MS, recursive=recursive,
                                     ignore_permission_denied=True, raise_interrupt=False):
                    _call(loop, batch, changes)
            except BaseException as exc:  # noqa: BLE001 - raised in the task that awaits the watch
                failure = exc
            _call(loop, _settle, ended, failure)

        threading.Thread(target=run, name="kiro-watch", daemon=True).start()
        stopped: asyncio.Future[object] = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait({ended, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            halt.set()  # the thread ends within STEP_MS, its watches with it
            gate.set()
            self._gates.discard(gate)
            stopped.cancel()
        try:
            if not ended.done():
                await asyncio.wait({ended}, timeout=SETUP_SECONDS)
            if ended.done():
                ended.result()
        finally:  # a watch that never set up (it failed: `_run` says so before `start` goes on)
            _settle(ready, None)

    async def aclose(self) -> None:
        if self._task is None:
            return
        assert self._stop is not None
        self._stop.set()
        with contextlib.suppress(BaseException):
            await asyncio.wait_for(self._task, 2)
        self._task = None


def _call(loop: asyncio.AbstractEventLoop, fn: Callable[..., object], *args: object) -> None:
    """`fn(*args)` on `loop`, from another thread; nothing once that event loop is closed."""
    with contextlib.suppress(RuntimeError):
        loop.call_soon_threadsafe(fn, *args)


def _settle(fut: asyncio.Future[Any], error: BaseException | None) -> None:
    if not fut.done():
        if error is None:
            fut.set_result(None)
        else:
            fut.set_exception(error)


_hubs: Registry[ChangeHub] = Registry()


def acquire_hub(root: Path) -> ChangeHub:
    """The workspace's hub for the running event loop, shared by every loop in this process. It watches
    from its first subscriber on (`ChangeHub.subscribe`): a loop that never waits never watches."""
    return _hubs.acquire(root, lambda: ChangeHub(root))


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
