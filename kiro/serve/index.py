"""One ordered, numbered stream over every loop's event log, stable across server restarts.

Each loop appends to its own `Logs/<task_id>.jsonl`. The server gives every complete line a
workspace-wide sequence number and records it in `.state/events.idx` (one line per event:
`<task_id> <start> <end>`; the line number is the sequence number). That file is the cursor space of
`GET /api/events` (the SSE `id:`) and of the WebSocket: a client that reconnects with `Last-Event-ID: N`
gets exactly the events numbered above N, also after the server restarted, and several servers over
one workspace number events the same way (they append to the index under a file lock, after reading
what the others appended).

Reading follows the event log's rule: only complete lines count; a line that is not a JSON object (a
torn write repaired by the next writer) is skipped, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from kiro import jsonl
from kiro.fs.locks import Flock

CACHE_LINES = 20_000
SAFETY_SCAN_SECONDS = 1.0


@dataclass(frozen=True, slots=True)
class Entry:
    task_id: str
    start: int
    end: int


class EventIndex:
    """The sequence. `sync()` indexes what was appended since the last look; waiters are woken."""

    def __init__(self, logs: Path, state_dir: Path, redact: Callable[[str], str] | None = None) -> None:
        self.logs = logs
        # what the server knows as secret, cut from each line it sends: an agent may write into Logs/
        self._redact = redact
        self.path = state_dir / "events.idx"
        self._lock_path = state_dir / "events.idx.lock"
        self.entries: list[Entry] = []
        self._indexed: dict[str, int] = {}
        self._idx_offset = 0
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._stop: asyncio.Event | None = None
        self.watch_error: str | None = None

    # -- the sequence ------------------------------------------------------------------------

    @property
    def last(self) -> int:
        return len(self.entries)

    def line(self, seq: int) -> bytes:
        """The raw JSON line (no newline) of event `seq` (1-based)."""
        cached = self._cache.get(seq)
        if cached is not None:
            return cached
        e = self.entries[seq - 1]
        try:
            with open(self.logs / f"{e.task_id}.jsonl", "rb") as fh:
                fh.seek(e.start)
                raw = fh.read(e.end - e.start).rstrip(b"\r\n")
        except OSError:
            raw = json.dumps({"task_id": e.task_id, "event": "warning",
                              "message": "this event's log is gone"}).encode()
        return self._cut(raw)

    def _cut(self, raw: bytes) -> bytes:
        """`raw` without a secret the server knows (`[REDACTED]` keeps the line JSON)."""
        if self._redact is None:
            return raw
        text = raw.decode("utf-8", "surrogateescape")
        cut = self._redact(text)
        return raw if cut == text else cut.encode("utf-8", "surrogateescape")

    def _remember(self, seq: int, raw: bytes) -> None:
        self._cache[seq] = self._cut(raw)
        while len(self._cache) > CACHE_LINES:
            self._cache.popitem(last=False)

    def _read_index(self) -> None:
        """Take in what was appended to the index file since we last read it (by us or another server)."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._idx_offset)
                data = fh.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n")
        if end < 0:
            return
        for raw in data[: end + 1].splitlines():
            parts = raw.split()
            if len(parts) != 3:
                continue  # a torn line left by a crashed writer: the writer's repair drops it
            tid, start, stop = sys.intern(parts[0].decode(errors="replace")), int(parts[1]), int(parts[2])
            self.entries.append(Entry(tid, start, stop))
            self._indexed[tid] = stop  # the last entry wins: after a log was replaced, offsets start again
        self._idx_offset += end + 1

    def _repair(self) -> None:
        """Called under the lock: drop a torn last line so the next append starts on a line of its own."""
        try:
            size = os.path.getsize(self.path)
        except FileNotFoundError:
            return
        if size == self._idx_offset:
            return
        with open(self.path, "rb+") as fh:
            fh.seek(self._idx_offset)
            rest = fh.read()
            if not rest.endswith(b"\n"):
                fh.truncate(self._idx_offset + rest.rfind(b"\n") + 1)

    def sync(self) -> int:
        """Index every complete line appended to any event log since the last look; returns how many.
        Waiters are woken by new events, also those another server over the workspace indexed first."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = Flock(self._lock_path)
        lock.acquire(timeout=None)  # another server appending: it is done in a moment
        known = self.last
        with lock:
            self._read_index()
            self._repair()
            found: list[tuple[str, int, int, bytes]] = []
            try:
                logs = sorted(self.logs.glob("*.jsonl"))
            except OSError:
                logs = []
            for p in logs:
                tid = sys.intern(p.name[: -len(".jsonl")])
                start = self._indexed.get(tid, 0)
                try:
                    size = p.stat().st_size
                    if size < start:  # the log was replaced by a shorter one: read it from the top again
                        start = 0
                    if size <= start:
                        continue
                    with open(p, "rb") as fh:
                        fh.seek(start)
                        data = fh.read(size - start)
                except OSError:
                    continue
                end = data.rfind(b"\n")
                if end < 0:
                    continue
                pos = start
                for raw in data[: end + 1].splitlines(keepends=True):
                    line_start, pos = pos, pos + len(raw)
                    body = raw.rstrip(b"\r\n")
                    if jsonl.record(body) is not None:
                        found.append((tid, line_start, pos, body))
                self._indexed[tid] = start + end + 1
            if not found:
                if self.last > known:  # indexed by another server first: our clients wait for them too
                    self._wake()
                return 0
            # per log in offset order (never re-sorted by time: the last entry of a log must be its furthest)
            text = "".join(f"{tid} {s} {e}\n" for tid, s, e, _b in found).encode()
            with open(self.path, "ab") as fh:
                fh.write(text)
            self._idx_offset += len(text)
            for tid, s, e, body in found:
                self.entries.append(Entry(tid, s, e))
                self._remember(len(self.entries), body)
        self._wake()
        return len(found)

    # -- waiting -----------------------------------------------------------------------------

    def _wake(self) -> None:
        if self._event is not None:
            self._event.set()
            self._event = asyncio.Event()

    async def wait_beyond(self, seq: int, timeout: float) -> bool:
        """Until there is an event numbered above `seq` (True) or the timeout passes (False)."""
        if self._event is None:
            self._event = asyncio.Event()
        while self.last <= seq:
            ev = self._event
            try:
                async with asyncio.timeout(timeout):  # no extra task per wait, unlike wait_for
                    await ev.wait()
            except TimeoutError:
                return self.last > seq
        return True

    # -- watching ----------------------------------------------------------------------------

    async def start(self) -> None:
        self._event = asyncio.Event()
        self.logs.mkdir(parents=True, exist_ok=True)
        self.sync()
        self._stop = asyncio.Event()
        self._task = asyncio.create_task(self._watch(), name="kiro-serve-index")

    async def _watch(self) -> None:
        """inotify (watchfiles) on Logs/: a new line is indexed within a few milliseconds. A scan every
        SAFETY_SCAN_SECONDS also catches anything the watcher missed; without a watcher, scans only."""
        assert self._stop is not None
        try:
            from watchfiles import awatch

            async for _changes in awatch(self.logs, debounce=10, step=2, stop_event=self._stop,
                                         rust_timeout=int(SAFETY_SCAN_SECONDS * 1000), yield_on_timeout=True,
                                         watch_filter=None, recursive=False, ignore_permission_denied=True):
                self._safe_sync()
        except Exception as exc:  # the watcher is an optimisation: fall back to scanning
            self.watch_error = f"{type(exc).__name__}: {exc}"
            while not self._stop.is_set():
                self._safe_sync()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stop.wait(), SAFETY_SCAN_SECONDS / 4)

    def _safe_sync(self) -> None:
        try:
            self.sync()
        except OSError as exc:
            self.watch_error = f"{type(exc).__name__}: {exc}"

    async def aclose(self) -> None:
        if self._stop is not None:
            self._stop.set()
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(self._task, 3)
            self._task = None
