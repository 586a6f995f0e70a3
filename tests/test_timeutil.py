"""kiro.timeutil: the times kiro writes (SPEC §4: ISO 8601 with a UTC offset, to the millisecond)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

from kiro import timeutil


def test_iso_of_now_is_utc_to_the_millisecond() -> None:
    stamp = timeutil.iso()
    assert len(stamp) == len("2026-11-30T07:43:20.807+00:00") and stamp.endswith("+00:00")
    assert timeutil.parse(stamp).tzinfo is not None


def test_iso_of_a_given_time_keeps_its_offset() -> None:
    when = datetime(2026, 1, 31, 9, 0, 5, 123999, tzinfo=UTC)
    assert timeutil.iso(when) == "2026-01-31T09:00:05.123+00:00"
    for old in (datetime(1969, 12, 31, 23, 59, 59, 999999, tzinfo=UTC), datetime(2999, 12, 31, 23, 59, 59, tzinfo=UTC),
                datetime(2024, 2, 29, 0, 0, 0, 500, tzinfo=UTC), timeutil.parse("2026-11-30T07:43:20.807+00:00")):
        assert timeutil.iso(old) == old.isoformat(timespec="milliseconds")
    there = when.astimezone(timezone(timedelta(hours=2)))
    assert timeutil.iso(there) == "2026-01-31T11:00:05.123+02:00"
    assert timeutil.parse(timeutil.iso(there)) == when.replace(microsecond=123000)
