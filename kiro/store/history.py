"""The history index (SPEC §11): `.state/kiro.db` (SQLite) holds every loop's state transitions, runs,
step attempts and messages, for `kiro loop history`.

The event logs (`Logs/<task_id>.jsonl`) stay the source of truth; the index is derived from them.
Each query first brings the index up to date: it reads what each log gained since the offset it
recorded (one transaction per refresh, so a crash mid-refresh leaves the previous index). A log that
shrank or was replaced (another inode) is re-read from the start; a missing, unreadable or corrupt
database is deleted and rebuilt from all the logs. So the index answers after any crash, also of
kiro itself while writing it.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from typing import Any

from kiro.errors import UserError
from kiro.store.logread import read_new
from kiro.store.workspace import TASK_ID_RE, Workspace

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sources (path TEXT PRIMARY KEY, task_id TEXT NOT NULL, ino INTEGER NOT NULL,
                                    offset INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS records (seq INTEGER PRIMARY KEY AUTOINCREMENT, ts TEXT NOT NULL, task_id TEXT NOT NULL,
                                    kind TEXT NOT NULL, data TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS records_task ON records (task_id, ts);
"""
KINDS = ("transition", "run", "attempt", "message")


def record_of(event: dict[str, Any]) -> dict[str, Any] | None:
    """The history record an event makes, or None for events history does not keep."""
    name = event.get("event")
    base = {"ts": event.get("ts", ""), "task_id": event.get("task_id", ""), "iteration": event.get("iteration")}
    if name == "state_changed":
        return {**base, "kind": "transition", "from": event.get("from"), "to": event.get("to"),
                "reason": event.get("reason")}
    if name in ("loop_started", "loop_resumed"):
        return {**base, "kind": "run", "event": name[len("loop_"):], "executor": event.get("executor")}
    if name == "loop_finished":
        return {**base, "kind": "run", "event": "finished", "status": event.get("status"),
                "reason": event.get("reason"), "exit_code": event.get("exit_code")}
    if name == "schedule_fired":  # a scheduled task's run (SPEC §11 schedules)
        return {**base, "kind": "run", "event": "scheduled", "run": event.get("run"),
                "catch_up": event.get("catch_up", False), "missed": event.get("missed", 0)}
    if name == "run_finished":
        return {**base, "kind": "run", "event": "run_finished", "run": event.get("run"),
                "report": event.get("report"), "next_run_at": event.get("next_run_at")}
    if name in ("step_completed", "step_failed", "step_interrupted"):
        out = {**base, "kind": "attempt", "step_id": event.get("step_id"), "attempt": event.get("attempt"),
               "outcome": name[len("step_"):]}
        if name == "step_failed":
            out["error"] = str(event.get("error") or "")[:300]
        return out
    if name == "message_received":
        return {**base, "kind": "message", "direction": "in", "from": event.get("from"),
                "message_id": event.get("message_id")}
    if name == "message_sent":
        return {**base, "kind": "message", "direction": "out", "to": event.get("to"),
                "message_id": event.get("message_id")}
    return None


class History:
    def __init__(self, ws: Workspace) -> None:
        self.ws = ws
        self.path = ws.state_dir / "kiro.db"

    def _connect(self) -> sqlite3.Connection:
        """The index; in memory when the workspace has no state folder yet: a read command in a folder
        that is not (yet) a workspace creates nothing there."""
        where = self.path if self.path.parent.is_dir() else ":memory:"
        db = sqlite3.connect(where, timeout=30)
        db.executescript(_SCHEMA)
        row = db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone()
        if row is None:
            db.execute("INSERT INTO meta VALUES ('schema', ?)", (SCHEMA_VERSION,))
            db.commit()
        elif row[0] != SCHEMA_VERSION:
            raise sqlite3.DatabaseError(f"schema {row[0]}")
        return db

    def open(self) -> tuple[sqlite3.Connection, str | None]:
        """The database, up to date; and a note when it had to be rebuilt from the logs."""
        note = None  # a missing index is simply built from the logs
        try:
            db = self._connect()
            self.refresh(db)
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(OSError):
                for p in (self.path, self.path.with_name("kiro.db-journal"), self.path.with_name("kiro.db-wal")):
                    p.unlink(missing_ok=True)
            try:
                db = self._connect()
            except sqlite3.DatabaseError as again:  # not a file kiro may delete: a folder in its place
                raise UserError(f"the history index {self.ws.relative(self.path)} cannot be opened ({again}); "
                                f"move it away and kiro builds it again from the event logs") from None
            self.refresh(db)
            note = f"the index {self.ws.relative(self.path)} was unreadable ({exc}); rebuilt it from the event logs"
        return db, note

    def refresh(self, db: sqlite3.Connection) -> None:
        known = {row[0]: (row[1], row[2]) for row in db.execute("SELECT path, ino, offset FROM sources")}
        logs = sorted(self.ws.logs.glob("*.jsonl")) if self.ws.logs.is_dir() else []
        with db:
            for log in logs:
                tid = log.stem
                if not TASK_ID_RE.match(tid):
                    continue
                try:
                    st = log.stat()
                except OSError:
                    continue
                key = str(log.name)
                ino, offset = known.get(key, (st.st_ino, 0))
                if ino != st.st_ino or offset > st.st_size:  # replaced or truncated: read it again
                    db.execute("DELETE FROM records WHERE task_id = ?", (tid,))
                    ino, offset = st.st_ino, 0
                if key in known and offset == st.st_size and ino == known[key][0]:
                    continue
                events, offset = read_new(log, offset)
                rows = []
                for e in events:
                    rec = record_of(e)
                    if rec is not None:
                        rec["task_id"] = rec["task_id"] or tid
                        rows.append((rec["ts"], rec["task_id"], rec["kind"], json.dumps(rec, ensure_ascii=False)))
                db.executemany("INSERT INTO records (ts, task_id, kind, data) VALUES (?, ?, ?, ?)", rows)
                db.execute("INSERT OR REPLACE INTO sources VALUES (?, ?, ?, ?)", (key, tid, st.st_ino, offset))

    def query(self, task_id: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
        db, note = self.open()
        try:
            if task_id is None:
                rows = db.execute("SELECT data FROM records ORDER BY ts, seq").fetchall()
            else:
                rows = db.execute("SELECT data FROM records WHERE task_id = ? ORDER BY ts, seq", (task_id,)).fetchall()
        finally:
            db.close()
        return [json.loads(r[0]) for r in rows], note


def describe(rec: dict[str, Any]) -> str:
    kind = rec["kind"]
    if kind == "transition":
        why = f" ({rec['reason']})" if rec.get("reason") else ""
        return f"{rec.get('from')} -> {rec.get('to')}{why}"
    if kind == "run":
        if rec.get("event") == "scheduled":
            extra = f", catching up {rec.get('missed')} missed fire(s)" if rec.get("catch_up") else ""
            return f"scheduled run {rec.get('run')} started{extra}"
        if rec.get("event") == "run_finished":
            return f"scheduled run {rec.get('run')} finished: {rec.get('report')}, next {rec.get('next_run_at')}"
        if rec.get("event") == "finished":
            return f"finished: {rec.get('status')} ({rec.get('reason')}), exit {rec.get('exit_code')}"
        return f"{rec.get('event')} ({rec.get('executor')})"
    if kind == "attempt":
        err = f": {rec['error'][:80]}" if rec.get("error") else ""
        nth = f" attempt {rec['attempt']}" if rec.get("attempt") is not None else ""  # an interruption has none
        return f"step {rec.get('step_id')}{nth} {rec.get('outcome')}{err}"
    if rec.get("direction") == "in":
        return f"received from {rec.get('from')}"
    return f"sent to {rec.get('to')}"


def render(records: list[dict[str, Any]]) -> str:
    if not records:
        return "no history yet\n"
    lines = [f"{r['ts']}  {r['task_id']:<20} {r['kind']:<10} {describe(r)}" for r in records]
    return "\n".join(lines) + "\n"
