"""Times: ISO 8601 with a UTC offset everywhere (SPEC §4)."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

# `iso()` of now, as `now().isoformat(timespec="milliseconds")` gives it, made from the clock's nanoseconds: the
# text up to the second made once a second, the milliseconds and offset from a table (isoformat was ~12 K
# instructions a call, and a step stamps several times: issue #41). `_second` is replaced whole, never changed
# in place, so a thread reads a second and its text together.
_MILLIS = tuple(f".{n:03d}+00:00" for n in range(1000))
_second: tuple[int, str] = (-1, "")


def now() -> datetime:
    return datetime.now(UTC)


def iso(dt: datetime | None = None) -> str:
    if dt is None:
        sec, ns = divmod(time.time_ns(), 1_000_000_000)  # datetime.now rounds down to the microsecond, as this does
        return _seconds_text(sec) + _MILLIS[ns // 1_000_000]
    if dt.tzinfo is UTC:  # kiro's own times (`now()`): the same table
        return _seconds_text((dt - _EPOCH) // _SECOND) + _MILLIS[dt.microsecond // 1000]
    return dt.isoformat(timespec="milliseconds")


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SECOND = timedelta(seconds=1)


def _seconds_text(sec: int) -> str:
    """`YYYY-MM-DDTHH:MM:SS` of the UTC second `sec` since the epoch, made once a second."""
    global _second
    kept = _second
    if kept[0] != sec:
        kept = _second = (sec, (_EPOCH + timedelta(seconds=sec)).isoformat()[:19])
    return kept[1]


def parse(text: str) -> datetime:
    dt = datetime.fromisoformat(text)
    return dt if dt.tzinfo else dt.replace(tzinfo=UTC)


def human_duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 10:
        return f"{seconds:.1f}s"
    s = int(round(seconds))
    if s < 60:
        return f"{s}s"
    m, s = divmod(s, 60)
    if m < 60:
        return f"{m}m {s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h {m:02d}m"
