"""The event log: `Logs/<task_id>.jsonl`, one JSON object per line, appended and flushed as it
happens (SPEC §8). The engine emits events; the log, the console and the dashboard listen.

A torn last line (a crash mid-write) is skipped by readers, never fatal.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal, get_args

from kiro import diskfull, safeio, timeutil
from kiro.bounds import EVENT_FIELD_CHARS, clip_fields
from kiro.redact import Redactor

EventName = Literal[
    "loop_started",
    "loop_resumed",
    "iteration_started",
    "step_started",
    "tool_called",
    "model_called",
    "context_wrapped",
    "step_completed",
    "step_failed",
    "step_interrupted",
    "step_recovered",
    "verify_failed",
    "reinjected",
    "backoff",
    "guardrail_triggered",
    "stop_condition",
    "state_changed",
    "state_recovered",
    "task_moved",
    "task_edited",
    "warning",
    "human_requested",
    "report_written",
    "notifier_failed",
    "loop_finished",
    # messages (SPEC §11, kiro.messages)
    "message_received",
    "message_delivered",
    "message_sent",
    # approval of agent-proposed steps (SPEC §11, kiro.approval)
    "steps_proposed",
    "proposal_approved",
    "proposal_rejected",
    # git (SPEC §9, kiro.checkpoints)
    "checkpoint_created",
    "checkpoint_skipped",
    "checkpoint_failed",
    "checkpoint_recovered",
    "git_lock_cleared",
    "worktree_created",
    "worktree_removed",
    "branch_left",
    "merge_completed",
    "merge_conflict",
    "merge_failed",
    "merge_resumed",
    "rolled_back",
    "rollback_resumed",
]
EVENT_NAMES: frozenset[str] = frozenset(get_args(EventName))

Listener = Callable[[dict[str, Any]], None]


def make_event(task_id: str, iteration: int, event: str, fields: dict[str, Any]) -> dict[str, Any]:
    """One event record. Known names only: a typo here is a bug, not a new kind of event."""
    if event not in EVENT_NAMES:
        raise ValueError(f"unknown event {event!r}")
    record: dict[str, Any] = {"ts": timeutil.iso(), "task_id": task_id, "iteration": iteration, "event": event}
    record.update(fields)
    return record


class EventLog:
    """Appends events to one JSONL file. Opened lazily, kept open, flushed per line. Every line
    passes through the loop's redactor on its way to disk."""

    def __init__(self, path: Path, redact: Redactor | None = None) -> None:
        self.path = path
        self.redact = redact or Redactor()
        self._fh: Any = None

    def __call__(self, record: dict[str, Any]) -> None:
        self.append(record)

    def append(self, record: dict[str, Any]) -> None:
        if self._fh is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = safeio.open_regular(self.path, write=True, fix="move it away")  # never blocks on a FIFO
            self._repair_torn_tail()
        record = clip_fields(record, EVENT_FIELD_CHARS)
        line = self.redact.text(json.dumps(record, ensure_ascii=False, default=str)) + "\n"
        data = memoryview(line.encode("utf-8"))
        written = 0

        def write_rest() -> None:  # one line, written whole even across a retry after a full disk
            nonlocal written
            while written < len(data):
                written += os.write(self._fh, data[written:])

        diskfull.retry(write_rest, self.path.name)

    def _repair_torn_tail(self) -> None:
        """After a crash the file may end mid-line: start the next record on a line of its own."""
        try:
            size = os.path.getsize(self.path)
            if size == 0:
                return
            with open(self.path, "rb") as fh:
                fh.seek(size - 1)
                if fh.read(1) != b"\n":
                    os.write(self._fh, b"\n")
        except OSError:
            return

    def close(self) -> None:
        if self._fh is not None:
            os.close(self._fh)
            self._fh = None


def read_events(path: Path, *, offset: int = 0) -> Iterator[dict[str, Any]]:
    """Every well-formed event in the file; broken lines (a torn tail) are skipped."""
    try:
        fh = open(safeio.open_regular(path, fix="move it away; kiro starts a new one"), "rb")  # noqa: SIM115
    except FileNotFoundError:
        return
    with fh:
        if offset:
            fh.seek(offset)
        for raw in fh:
            try:
                record = json.loads(raw)
            except ValueError:
                continue
            if isinstance(record, dict):
                yield record


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
    out: list[dict[str, Any]] = []
    for raw in data[: end + 1].splitlines():
        try:
            record = json.loads(raw)
        except ValueError:
            continue
        if isinstance(record, dict):
            out.append(record)
    return out, offset + end + 1
