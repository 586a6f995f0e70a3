"""JSON Lines as kiro reads them (event logs, transcripts, inboxes, journals, process ledgers): one
JSON object per line. Agents, shell steps and people can write these files, so a line that is torn
(a crash mid-append), not JSON, not an object, or nested too deep for Python's parser (a hostile
line of 100,000 brackets raises RecursionError, not ValueError) is no record: every reader skips it,
and none of them fails on it. `line` is how kiro writes one."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

line = json.JSONEncoder(ensure_ascii=False, default=str).encode
"""`json.dumps(value, ensure_ascii=False, default=str)` with one encoder made once, not one a call: an
event's line (kiro.store.events.EventLog, kiro.store.redact's search of it)."""


def record(line: bytes | str) -> dict[str, Any] | None:
    """The object on one line, or None when the line holds none."""
    try:
        value = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def records(lines: Iterable[bytes | str]) -> Iterator[dict[str, Any]]:
    """The objects of `lines`, in order; lines that hold none are skipped."""
    for line in lines:
        found = record(line)
        if found is not None:
            yield found
