"""Long-term memory: save and recall, source tags, FTS5 and the keyword fallback."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from kiro.store.memory import MAX_CONTENT_CHARS, MemoryStore, fts5_available


@pytest.fixture(params=["fts5", "keywords"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> MemoryStore:
    if request.param == "fts5" and not fts5_available():
        pytest.skip("this SQLite has no FTS5")
    return MemoryStore(tmp_path / ".state" / "memory.db", use_fts=request.param == "fts5")


def test_save_and_recall_by_keyword(store: MemoryStore) -> None:
    store.save("The build uses make, not tox", "fact", 0.9, "loop:a")
    store.save("Login endpoint lives in app/login.py", "finding", 0.5, "loop:a")
    store.save("Unrelated remark about the weather", "note", 0.1, "loop:b")

    hits = store.recall("where is the login endpoint?")
    assert hits[0].content == "Login endpoint lives in app/login.py"
    assert all("weather" not in m.content for m in hits)
    assert store.recall("make build")[0].type == "fact"
    assert store.recall("nothing matches zzz") == []


def test_source_filter_and_index(store: MemoryStore) -> None:
    store.save("shared word alpha", source="loop:a")
    store.save("shared word beta", source="loop:b")
    assert [m.source for m in store.recall("shared", source="loop:b")] == ["loop:b"]
    assert {m.source for m in store.recall("shared")} == {"loop:a", "loop:b"}
    conn = sqlite3.connect(store.path)
    try:
        indexes = {row[1] for row in conn.execute("PRAGMA index_list('memories')")}
        columns = [row[1] for row in conn.execute("PRAGMA table_info('memories')")]
    finally:
        conn.close()
    assert "idx_memories_source" in indexes
    assert columns == ["id", "source", "type", "content", "importance", "created_at"]


def test_importance_breaks_ties_and_is_clamped(store: MemoryStore) -> None:
    store.save("deploy notes one", importance=0.1)
    store.save("deploy notes two", importance=5)
    hits = store.recall("deploy notes")
    assert hits[0].content == "deploy notes two" and hits[0].importance == 1.0


def test_empty_query_gives_the_latest(store: MemoryStore) -> None:
    for i in range(8):
        store.save(f"memory {i}", type="summary" if i % 2 else "note", source="loop:x")
    assert [m.content for m in store.recall("", limit=3)] == ["memory 7", "memory 6", "memory 5"]
    latest = store.recent(source="loop:x", type="summary", limit=2)
    assert [m.content for m in latest] == ["memory 7", "memory 5"]


def test_query_syntax_is_never_sql_or_fts(store: MemoryStore) -> None:
    store.save('quote " and star * and NEAR(x) and OR')
    for query in ['" OR 1=1 --', "NEAR(", "star*", "'; DROP TABLE memories; --", "AND OR NOT"]:
        store.recall(query)  # no exception
    assert store.count() == 1


def test_content_is_bounded_and_not_empty(store: MemoryStore) -> None:
    store.save("x" * (MAX_CONTENT_CHARS + 500))
    assert len(store.recent()[0].content) < MAX_CONTENT_CHARS + 50
    with pytest.raises(ValueError):
        store.save("   ")


def test_concurrent_writers(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"

    def writer(n: int) -> None:
        s = MemoryStore(path)
        for i in range(20):
            s.save(f"writer {n} note {i}", source=f"loop:{n}")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = MemoryStore(path)
    assert s.count() == 80 and s.count("loop:2") == 20
    assert len(s.recall("writer note", limit=50)) == 50


def test_fts_index_is_built_for_an_older_database(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    MemoryStore(path, use_fts=False).save("written before fts existed")
    if not fts5_available():
        pytest.skip("this SQLite has no FTS5")
    assert MemoryStore(path, use_fts=True).recall("fts existed")[0].content == "written before fts existed"
