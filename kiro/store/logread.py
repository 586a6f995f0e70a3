"""The event log read back as records (`Logs/<task_id>.jsonl`, SPEC §8): every well-formed line as a
dict, the last N lines read backwards from the end, the lines appended since an offset. No models: a
read command (`kiro loop logs`) shows the records as they are and never builds the event kinds of
kiro.store.events (which reads them typed with `read_typed`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from kiro import jsonl, timeutil
from kiro.fs import safeio


def read_events(path: Path, *, offset: int = 0) -> Iterator[dict[str, Any]]:
    """Every well-formed event in the file; broken lines (a torn tail) are skipped."""
    try:
        fd = safeio.open_regular(path, fix="move it away; kiro starts a new one")
    except FileNotFoundError:
        return
    yield from _records(fd, offset)


def _records(fd: int, offset: int) -> Iterator[dict[str, Any]]:
    """The events of the open log `fd` from `offset` on; the file is closed after them."""
    with open(fd, "rb") as fh:
        if offset:
            fh.seek(offset)
        yield from jsonl.records(fh)


TAIL_BLOCK = 64 * 1024
SINCE_SLACK = timedelta(days=1)  # how far back a clock set back between two events may have gone
SINCE_WHOLE_BYTES = 1024 * 1024  # a log this small is read whole: as quick as looking for where to begin


def read_since(path: Path, since: datetime) -> Iterator[dict[str, Any]]:
    """The events of `read_events(path)` from about `since` on: a log is appended in the order its events
    happen, so where to begin is found by bisecting the file on the events' `ts`, with a day's slack for a
    clock set back between two events. Every event written at or after `since` is among them (and some
    before it: the caller filters); what it costs is the events of the period, not the whole history (a
    loop's end computes the day's digest over every log of the workspace)."""
    try:
        fd = safeio.open_regular(path, fix="move it away; kiro starts a new one")
    except FileNotFoundError:
        return
    try:
        offset = _offset_before(fd, since - SINCE_SLACK)
    except BaseException:
        os.close(fd)
        raise
    yield from _records(fd, offset)  # the file it bisected, opened once


def _offset_before(fd: int, bound: datetime) -> int:
    """The start of a line before which every event was written before `bound` (0 when unsure)."""
    size = os.fstat(fd).st_size
    lo, hi = 0, size  # lo: a line start with only earlier events before it; hi: past the answer
    if size <= SINCE_WHOLE_BYTES:
        return 0
    while hi - lo > TAIL_BLOCK:
        mid = (lo + hi) // 2
        found = _event_after(fd, mid, hi)
        if found is None:
            break  # no dated event there (a torn or hand-made stretch): begin at what is known
        start, when = found
        if when < bound:
            lo = start
        else:
            hi = mid
    return lo


def _event_after(fd: int, pos: int, end: int) -> tuple[int, datetime] | None:
    """The first dated event whose line starts after `pos` and before `end`: its line's start and its time."""
    block = os.pread(fd, TAIL_BLOCK, pos)
    cut = block.find(b"\n")
    while cut >= 0 and pos + cut + 1 < end:
        start = cut + 1
        cut = block.find(b"\n", start)
        if cut < 0:
            return None  # a line longer than the block: leave it to the reading
        record = jsonl.record(block[start:cut])
        raw = record.get("ts") if record is not None else None
        if isinstance(raw, str):
            try:
                return pos + start, timeutil.parse(raw)
            except ValueError:
                pass
    return None


def read_last(path: Path, n: int) -> list[dict[str, Any]]:
    """The last `n` events of `read_events(path)`, read backwards from the file's end a block at a
    time: the cost is that of `n` events, not of the whole log (`kiro loop logs --tail N`)."""
    try:
        fd = safeio.open_regular(path, fix="move it away; kiro starts a new one")
    except FileNotFoundError:
        return []
    try:
        return _last_events(fd, n)
    finally:
        os.close(fd)


def _last_events(fd: int, n: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    if n <= 0:
        return found

    def take(raw: bytes) -> None:
        record = jsonl.record(raw) if raw.strip() else None
        if record is not None:  # a torn or broken line is skipped, as read_events skips it
            found.append(record)

    pos = os.fstat(fd).st_size
    carry = b""  # the start of a line whose beginning lies in an earlier block
    first = True
    while pos > 0 and len(found) < n:
        size = min(TAIL_BLOCK, pos)
        pos -= size
        lines = (os.pread(fd, size, pos) + carry).split(b"\n")
        carry = lines[0] if pos > 0 else b""
        complete = lines[1:] if pos > 0 else lines
        if first:
            first = False
            if complete and complete[-1] == b"":
                complete.pop()  # the newline that ends the file
        for raw in reversed(complete):
            take(raw)
            if len(found) >= n:
                break
    found.reverse()
    return found


def read_new(path: Path, offset: int) -> tuple[list[dict[str, Any]], int]:
    """Events appended since `offset` (complete lines only), and the new offset. For --follow."""
    try:
        with open(safeio.open_regular(path, fix="move it away; kiro starts a new one"), "rb") as fh:
            fh.seek(offset)
            data = fh.read(64 * 1024 * 1024)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    return list(jsonl.records(data[: end + 1].splitlines())), offset + end + 1
