"""Durable writes off the event loop: one ordered queue per writer (a loop's state and reports, an
agent's transcript), run on a small pool of threads shared by the process.

With a thousand loops in one process, a state save that fsyncs and renames on the event loop
stops every other loop for a millisecond or more. Here the loop's own task makes the bytes (the
state is only ever touched there) and hands the write over; the write runs on a worker thread, in
the order it was queued, and the loop goes on. Before its next observable step (a model call, a
step's process, a box checked, the run's end) the loop awaits `flush()`: SPEC §4's promise, the
state on disk after every change and before anything that depends on it happens, stands; only the
waiting moved off the event loop, where other loops can use it.

Without a running event loop (tests, tools) `submit` writes at once, in the caller's thread. So it
does while one loop is all this process runs (`loop_running`): then nobody else waits for the event
loop, and the hand-over costs more than the write it moves (the GIL passed back and forth between the
loop and the writer thread: 0.25-0.4 ms of each iteration's 1.4-1.9 ms, bench/loop_overhead.py).
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import queue
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio  # imported where a loop runs: read commands do without it

Job = Callable[[], object]
T = TypeVar("T")

WORKERS = 8  # parallel fsyncs: ext4 commits concurrent ones together, so a few threads go further than one
_pool_lock = threading.Lock()
_running_loops = 0  # loops running in this process (`loop_running`)


@contextlib.contextmanager
def loop_running() -> Iterator[None]:
    """Count one loop as running in this process while the block lasts. While it is the only one, its
    writes are made at once on the event loop (`WriteQueue.submit`); with two or more they go to the
    writer threads, so that one loop's fsync never holds up another."""
    global _running_loops
    with _pool_lock:
        _running_loops += 1
    try:
        yield
    finally:
        with _pool_lock:
            _running_loops -= 1


def alone() -> bool:
    """Whether at most one loop runs in this process (`loop_running`): then a short blocking job is cheaper
    done at once on the event loop than handed to a thread (nobody else waits for the loop)."""
    return _running_loops <= 1


class _Workers:
    """WORKERS long-lived threads that drain the write queues handed to them, one queue at a time
    each. Cheaper per write than `run_in_executor` (no futures, no event-loop wake-up unless a loop
    waits in `flush`). Daemon threads; at exit, what is queued is written first (`_wait_all`)."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue[WriteQueue | _Background] = queue.SimpleQueue()
        self.started = 0
        self.busy = 0  # queues handed over and not drained yet
        self.cond = threading.Condition()
        atexit.register(self._wait_all)

    def schedule(self, wq: WriteQueue | _Background) -> None:
        with self.cond:
            self.busy += 1
            if self.started < WORKERS:
                self.started += 1
                threading.Thread(target=self._run, name=f"kiro-write-{self.started}", daemon=True).start()
        self.queue.put(wq)

    def _run(self) -> None:
        while True:
            wq = self.queue.get()
            try:
                wq._drain()
            finally:
                with self.cond:
                    self.busy -= 1
                    if self.busy == 0:
                        self.cond.notify_all()

    def _wait_all(self) -> None:
        with self.cond:
            self.cond.wait_for(lambda: self.busy == 0, timeout=60)


_workers: _Workers | None = None


def workers() -> _Workers:
    global _workers
    with _pool_lock:
        if _workers is None:
            _workers = _Workers()
        return _workers


class _Background:
    """A job nobody waits for, run by a worker thread (`background`)."""

    __slots__ = ("job",)

    def __init__(self, job: Job) -> None:
        self.job = job

    def _drain(self) -> None:
        try:
            self.job()
        except Exception:  # noqa: BLE001 - nobody awaits it: said on stderr, as asyncio says an unretrieved error
            traceback.print_exc()


def background(job: Job) -> None:
    """Run `job` on a writer thread, waited for by nobody (only at exit): a timer's snapshot. Cheaper
    on the event loop than `run_in_executor`, whose futures cost more than the job's hand-over with a
    thousand loops' timers (12% of the event loop's time at 1,000 loops)."""
    workers().schedule(_Background(job))


async def call(fn: Callable[..., T], /, *args: Any) -> T:
    """`await asyncio.to_thread(fn, *args)` on a writer thread, with less work on the event loop (no
    context copy, no concurrent future): for a blocking durable write the loop waits for."""
    import asyncio

    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def job() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - raised in the awaiting task
            with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody awaits
                loop.call_soon_threadsafe(_settle, fut, None, exc)
        else:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, fut, result, None)

    workers().schedule(_Background(job))
    return await fut


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _wake(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


class WriteQueue:
    """One writer's jobs, run one at a time in the order submitted. A job submitted with a `key`
    replaces a queued job with the same key that has not started yet, when it is the last one queued
    (a state save superseded by the next one: the newer holds everything the older did)."""

    def __init__(self) -> None:
        self._jobs: collections.deque[tuple[object, Job]] = collections.deque()
        self._lock = threading.Lock()
        self._scheduled = False  # handed to a worker, which drains until nothing is queued
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._error: BaseException | None = None

    def submit(self, job: Job, *, key: object = None) -> None:
        import asyncio

        try:
            asyncio.get_running_loop()
        except RuntimeError:
            self._run_inline(job)
            return
        with self._lock:
            start = not self._scheduled
            here = start and alone()  # one loop, nothing of its own queued before
            if not here:
                if key is not None and self._jobs and self._jobs[-1][0] == key:
                    self._jobs[-1] = (key, job)
                else:
                    self._jobs.append((key, job))
                self._scheduled = True
        if here:
            self._run_here(job)
        elif start:
            workers().schedule(self)

    def _run_here(self, job: Job) -> None:
        """Run `job` now, in the caller's thread; its error is kept for `flush()`, as a worker keeps it."""
        try:
            job()
        except Exception as exc:  # noqa: BLE001 - surfaced by flush(), as from the writer thread
            if self._error is None:
                self._error = exc

    def _run_inline(self, job: Job) -> None:
        self._wait_idle()  # work queued from an event loop that ended without flushing: keep the order
        job()

    def _wait_idle(self) -> None:
        """Block until the worker has run every queued job (jobs are queued only with a drain scheduled)."""
        while True:
            with self._lock:
                if not self._scheduled:
                    return
            time.sleep(0.001)

    def _drain(self) -> None:
        while True:
            with self._lock:
                if not self._jobs:
                    self._scheduled = False
                    waiters, self._waiters = self._waiters, []
                    break
                _key, job = self._jobs.popleft()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - surfaced by flush(), in the loop's own task
                if self._error is None:
                    self._error = exc
        for loop, fut in waiters:
            with contextlib.suppress(RuntimeError):  # that event loop is closed: nobody waits any more
                loop.call_soon_threadsafe(_wake, fut)

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._scheduled and not self._jobs

    async def flush(self) -> None:
        """Wait until every job submitted so far has run; raise the first error one of them raised."""
        import asyncio

        with self._lock:
            if self._scheduled:
                fut: asyncio.Future[None] | None = asyncio.get_running_loop().create_future()
                self._waiters.append((asyncio.get_running_loop(), fut))  # type: ignore[arg-type]
            else:
                fut = None
        if fut is not None:
            await fut
        self.raise_error()

    def raise_error(self) -> None:
        error, self._error = self._error, None
        if error is not None:
            raise error

    def flush_sync(self) -> None:
        """Without a running event loop: wait for (or do) what is queued; raise the first error."""
        self._wait_idle()
        self.raise_error()
