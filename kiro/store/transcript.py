"""The agent's transcript: one JSONL file per loop, `.state/transcripts/<task_id>.jsonl`.

Every model request (only the messages that are new since the previous request), every response,
every tool call and its result, wrap-ups and restarts are appended as they happen, each tagged with
the iteration and attempt. It is the record a person reads to learn why the agent did what it did,
so it is written for completeness, not for the model: nothing in it is ever sent back.

Secrets never reach it: every line goes through the loop's `kiro.store.redact.Redactor` before it is
written.
"""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path
from typing import Any

from kiro import jsonl, timeutil
from kiro.fs.bounds import TRANSCRIPT_FIELD_CHARS, clip_fields
from kiro.fs.writer import WriteQueue
from kiro.store.redact import REDACTED, Redactor, looks_secret

__all__ = ["REDACTED", "Redactor", "Transcript", "looks_secret", "read"]


class Transcript:
    """Appends records to one loop's transcript. Lines are made where `write` is called and
    appended by a worker thread (`kiro.fs.writer`) when `kick` or `flush` hands them over, in order, a
    batch at a time: the file is opened in
    append mode (`O_APPEND`, one `write` per batch of whole lines), so a crash leaves at most a torn
    last line and two writers never interleave inside a line. `flush()` waits for what is queued;
    the openai executor flushes at the end of every attempt. Without a running event loop every
    line is written at once."""

    def __init__(self, path: Path, task_id: str, redact: Redactor | None = None) -> None:
        self.path = path
        self.task_id = task_id
        self.redact = redact or Redactor()
        self._pending: list[bytes] = []
        self._lock = threading.Lock()
        self._queue = WriteQueue()

    def write(self, kind: str, *, iteration: int, attempt: int, step_id: str | None = None,
              **fields: Any) -> None:
        record: dict[str, Any] = {
            "ts": timeutil.iso(), "task_id": self.task_id, "iteration": iteration, "attempt": attempt,
        }
        if step_id is not None:
            record["step_id"] = step_id
        record["kind"] = kind
        record.update(fields)
        text = jsonl.line(record)  # `json.dumps(record, ensure_ascii=False, default=str)`, one encoder made once
        if len(text) > TRANSCRIPT_FIELD_CHARS:  # no string in a shorter line can be longer than the cap
            record = clip_fields(record, TRANSCRIPT_FIELD_CHARS)  # a 30 MB reply is not stored whole
            text = jsonl.line(record)
        line = self.redact(text) + "\n"
        with self._lock:
            self._pending.append(line.encode("utf-8"))
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no event loop: written at once
            self._append()

    def kick(self) -> None:
        """Hand the lines made so far to the writer thread (the executor does before it waits for
        the model, and `flush` at the end of an attempt): one wake-up of the event loop per batch,
        not per line."""
        with self._lock:
            if not self._pending:
                return
        self._queue.submit(self._append, key="append")  # one queued append takes every pending line

    def _append(self) -> None:
        with self._lock:
            lines, self._pending = self._pending, []
        if not lines:
            return
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        except FileNotFoundError:  # the folder is made on first need, not checked every append (#12)
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            data = memoryview(b"".join(lines))
            while data:
                n = os.write(fd, data)
                data = data[n:]
        finally:
            os.close(fd)

    async def flush(self) -> None:
        self.kick()
        await self._queue.flush()

    def flush_sync(self) -> None:
        self._queue.flush_sync()
        self._append()


def read(path: Path) -> list[dict[str, Any]]:
    """Every complete record of a transcript; a torn last line is skipped."""
    records: list[dict[str, Any]] = []
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return records
    records.extend(jsonl.records(line for line in text.splitlines() if line.strip()))
    return records
