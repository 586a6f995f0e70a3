"""Long-term memory: what an agent learned, kept across steps, context restarts and runs.

One SQLite file per workspace (`.state/memory.db`), stdlib `sqlite3`. A memory is a row
(id, source, type, content, importance, created_at). The source says who wrote it
(`loop:<task_id>` for the openai agent), so a loop can recall its own notes or everybody's
(seed 001: source tags that are filtered on, with an index on `source`).

Recall ranks by SQLite FTS5 (bm25) when the SQLite build has it, which the usual CPython builds
do; otherwise by a simple keyword score (how many query words a memory contains). Both then
prefer important and recent memories. An empty query returns the most important recent ones.

Several loops (threads or processes) may share the file: WAL mode, a busy timeout, and a short
connection per call keep them from tripping over each other.
"""

from __future__ import annotations

import contextlib
import functools
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kiro import timeutil

BUSY_TIMEOUT_SECONDS = 10.0
MAX_CONTENT_CHARS = 20_000
MAX_LIMIT = 50
_WORD_RE = re.compile(r"\w+", re.UNICODE)
# Words too common to say what a memory is about; dropped from queries unless nothing else is left.
_STOPWORDS = frozenset("""
a an and are as at be by do does did for from how i in is it its of on or that the this to was were
what when where which who why will with you your we our not no can should would could there here
""".split())

_SCHEMA = """
CREATE TABLE IF NOT EXISTS memories (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    source TEXT NOT NULL,
    type TEXT NOT NULL,
    content TEXT NOT NULL,
    importance REAL NOT NULL DEFAULT 0.5,
    created_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS idx_memories_source ON memories(source);
"""

_FTS_SCHEMA = """
CREATE VIRTUAL TABLE IF NOT EXISTS memories_fts USING fts5(
    content, type, content='memories', content_rowid='id'
);
CREATE TRIGGER IF NOT EXISTS memories_ai AFTER INSERT ON memories BEGIN
    INSERT INTO memories_fts(rowid, content, type) VALUES (new.id, new.content, new.type);
END;
CREATE TRIGGER IF NOT EXISTS memories_ad AFTER DELETE ON memories BEGIN
    INSERT INTO memories_fts(memories_fts, rowid, content, type)
    VALUES ('delete', old.id, old.content, old.type);
END;
"""


@dataclass(frozen=True)
class Memory:
    id: int
    source: str
    type: str
    content: str
    importance: float
    created_at: str


@functools.cache
def fts5_available() -> bool:
    """Whether this Python's SQLite was built with FTS5 (asked once per process)."""
    try:
        conn = sqlite3.connect(":memory:")
        try:
            conn.execute("CREATE VIRTUAL TABLE t USING fts5(x)")
        finally:
            conn.close()
    except sqlite3.Error:
        return False
    return True


def _words(text: str) -> list[str]:
    return [w.lower() for w in _WORD_RE.findall(text)]


class MemoryStore:
    """The memory database of one workspace. Cheap to construct; the file is created on first use."""

    def __init__(self, path: Path, *, use_fts: bool | None = None) -> None:
        self.path = path
        self.use_fts = fts5_available() if use_fts is None else use_fts
        self._ready = False

    # -- plumbing --------------------------------------------------------------------------

    @contextlib.contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_SECONDS)
        try:
            if not self._ready:
                self._init(conn)
            with conn:  # one transaction: committed on success, rolled back on error
                yield conn
        finally:
            conn.close()

    def _init(self, conn: sqlite3.Connection) -> None:
        with contextlib.suppress(sqlite3.OperationalError):  # another process may hold it right now
            conn.execute("PRAGMA journal_mode=WAL")
        conn.executescript(_SCHEMA)
        if self.use_fts:
            try:
                existed = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name = 'memories_fts'").fetchone() is not None
                conn.executescript(_FTS_SCHEMA)
                if not existed:  # a database written before FTS5 was used: index what is there
                    conn.execute("INSERT INTO memories_fts(memories_fts) VALUES ('rebuild')")
                    conn.commit()
            except sqlite3.OperationalError:
                self.use_fts = False
        self._ready = True

    # -- API -------------------------------------------------------------------------------

    def save(self, content: str, type: str = "note", importance: float = 0.5, source: str = "user") -> int:
        """Store one memory; returns its id. Content is clipped to MAX_CONTENT_CHARS and importance
        clamped to 0..1, so a careless caller cannot bloat the file or skew ranking."""
        content = content.strip()
        if not content:
            raise ValueError("memory content is empty")
        if len(content) > MAX_CONTENT_CHARS:
            content = content[:MAX_CONTENT_CHARS] + " [... clipped]"
        importance = min(1.0, max(0.0, float(importance)))
        with self._connect() as conn:
            cur = conn.execute(
                "INSERT INTO memories (source, type, content, importance, created_at) VALUES (?, ?, ?, ?, ?)",
                (source, type, content, importance, timeutil.iso()),
            )
            rowid = cur.lastrowid
        assert rowid is not None
        return rowid

    def recall(self, query: str, source: str | None = None, limit: int = 5,
               type: str | None = None) -> list[Memory]:
        """The memories that best match `query`, optionally only those from `source` (and of `type`)."""
        limit = max(1, min(MAX_LIMIT, limit))
        words = list(dict.fromkeys(_words(query)))
        words = [w for w in words if w not in _STOPWORDS] or words
        with self._connect() as conn:
            if not words:
                return self._recent(conn, source, type, limit)
            if self.use_fts:
                return self._recall_fts(conn, words, source, type, limit)
            return self._recall_keywords(conn, words, source, type, limit)

    def recent(self, source: str | None = None, limit: int = 5, type: str | None = None) -> list[Memory]:
        with self._connect() as conn:
            return self._recent(conn, source, type, max(1, min(MAX_LIMIT, limit)))

    def count(self, source: str | None = None) -> int:
        with self._connect() as conn:
            if source is None:
                row = conn.execute("SELECT COUNT(*) FROM memories").fetchone()
            else:
                row = conn.execute("SELECT COUNT(*) FROM memories WHERE source = ?", (source,)).fetchone()
        return int(row[0])

    # -- queries ---------------------------------------------------------------------------

    @staticmethod
    def _filters(source: str | None, type: str | None, prefix: str = "") -> tuple[str, list[object]]:
        clauses: list[str] = []
        params: list[object] = []
        if source is not None:
            clauses.append(f"{prefix}source = ?")
            params.append(source)
        if type is not None:
            clauses.append(f"{prefix}type = ?")
            params.append(type)
        return (" AND ".join(clauses), params)

    def _recent(self, conn: sqlite3.Connection, source: str | None, type: str | None,
                limit: int) -> list[Memory]:
        where, params = self._filters(source, type)
        sql = ("SELECT id, source, type, content, importance, created_at FROM memories"
               + (f" WHERE {where}" if where else "")
               + " ORDER BY id DESC LIMIT ?")
        return [Memory(*row) for row in conn.execute(sql, [*params, limit])]

    def _recall_fts(self, conn: sqlite3.Connection, words: list[str], source: str | None,
                    type: str | None, limit: int) -> list[Memory]:
        # Each word quoted, so the model's query can never be FTS5 syntax; OR so partial matches count.
        match = " OR ".join('"' + w.replace('"', '""') + '"' for w in words)
        where, params = self._filters(source, type, prefix="m.")
        # bm25 is lower-is-better; importance nudges ties and near-ties toward what mattered.
        sql = ("SELECT m.id, m.source, m.type, m.content, m.importance, m.created_at "
               "FROM memories_fts JOIN memories m ON m.id = memories_fts.rowid "
               "WHERE memories_fts MATCH ?" + (f" AND {where}" if where else "")
               + " ORDER BY bm25(memories_fts) - m.importance, m.id DESC LIMIT ?")
        return [Memory(*row) for row in conn.execute(sql, [match, *params, limit])]

    def _recall_keywords(self, conn: sqlite3.Connection, words: list[str], source: str | None,
                         type: str | None, limit: int) -> list[Memory]:
        where, params = self._filters(source, type)
        likes = " OR ".join("lower(content) LIKE ?" for _ in words)
        sql = ("SELECT id, source, type, content, importance, created_at FROM memories WHERE (" + likes + ")"
               + (f" AND {where}" if where else ""))
        rows = [Memory(*row) for row in conn.execute(sql, [*(f"%{w}%" for w in words), *params])]

        def score(m: Memory) -> tuple[float, int]:
            have = set(_words(m.content)) | set(_words(m.type))
            return (sum(1 for w in words if w in have) + m.importance, m.id)

        rows.sort(key=score, reverse=True)
        return rows[:limit]
