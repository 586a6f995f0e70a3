"""`kiro loop history` (SPEC §11): the SQLite index `.state/kiro.db` of transitions, runs, attempts and
messages, kept from the event logs and rebuilt from them when missing, corrupt, or after a crash."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from tests.conftest import Workspace, shell_task


def _history(ws: Workspace, *args: str) -> list[dict[str, Any]]:
    r = ws.run("loop", "history", "--json", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)  # type: ignore[no-any-return]


def test_history_lists_transitions_runs_and_attempts_in_order(ws: Workspace) -> None:
    ws.task(shell_task(2))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "one")
    assert r.returncode == 0, r.stderr
    ws.task(shell_task(1, cmd="exit 3"), "Specs/other/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "two", "--max-iterations", "1")
    assert r.returncode == 4, r.stderr
    recs = _history(ws, "--task-id", "one")
    assert {r["task_id"] for r in recs} == {"one"}
    kinds = [r["kind"] for r in recs]
    assert set(kinds) == {"transition", "run", "attempt"}
    assert [r["ts"] for r in recs] == sorted(r["ts"] for r in recs)
    attempts = [(r["step_id"], r["outcome"]) for r in recs if r["kind"] == "attempt"]
    assert attempts == [("1", "completed"), ("2", "completed")]
    transitions = [(r["from"], r["to"]) for r in recs if r["kind"] == "transition"]
    assert transitions[-1][1] == "completed" and all(f and t for f, t in transitions)
    runs = [r["event"] for r in recs if r["kind"] == "run"]
    assert runs == ["started", "finished"]
    both = _history(ws)
    assert {r["task_id"] for r in both} == {"one", "two"}
    failed = [r for r in both if r["kind"] == "attempt" and r["task_id"] == "two"]
    assert [r["outcome"] for r in failed] == ["failed"]
    assert (ws.root / ".state/kiro.db").exists()
    text = ws.run("loop", "history", "--task-id", "one")
    assert text.returncode == 0 and "step 2 attempt 1 completed" in text.stdout

    # missing or corrupt: rebuilt from the logs, same answer
    (ws.root / ".state/kiro.db").unlink()
    assert _history(ws) == both
    (ws.root / ".state/kiro.db").write_bytes(b"this is not a database" * 100)
    r = ws.run("loop", "history", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == both and "rebuilt" in r.stderr


def test_history_answers_after_a_crash_and_catches_up(ws: Workspace) -> None:
    once = 'if [ "$KIRO_STEP_ID" = 2 ] && [ ! -f slept ]; then touch slept; sleep 600; fi'
    ws.task(shell_task(3, cmd=f'echo "$KIRO_STEP_ID" >> log.txt; {once}'))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "crash")
    ws.wait_for(lambda: (ws.root / "log.txt").read_text().count("\n") == 2, what="step 2 running")
    before = _history(ws, "--task-id", "crash")  # indexed while the loop runs
    assert [(r["step_id"], r["outcome"]) for r in before if r["kind"] == "attempt"] == [("1", "completed")]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    after = _history(ws, "--task-id", "crash")
    assert after == before  # what the log holds; the kill left no torn record behind
    r = ws.kiro("loop", "resume", "--task-id", "crash")
    assert r.returncode == 0, r.stdout + r.stderr
    recs = _history(ws, "--task-id", "crash")
    runs = [r["event"] for r in recs if r["kind"] == "run"]
    assert runs == ["started", "resumed", "finished"]
    assert [(r["step_id"], r["outcome"]) for r in recs if r["kind"] == "attempt"] == [
        ("1", "completed"), ("2", "completed"), ("3", "completed")]
    assert recs[: len(before)] == before  # the index grew; nothing indexed before was lost or doubled


def test_history_refuses_an_unknown_loop(ws: Workspace) -> None:
    r = ws.run("loop", "history", "--task-id", "ghost")
    assert r.returncode == 1 and "ghost" in r.stderr and "Traceback" not in r.stderr


def test_an_index_kiro_cannot_open_or_delete_is_one_line(ws: Workspace) -> None:
    """A folder where `.state/kiro.db` belongs: sqlite cannot open it and kiro cannot delete it to rebuild
    the index; `kiro loop history` ended with an internal error. Now one line naming it and the fix."""
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "one").returncode == 0
    (ws.root / ".state/kiro.db").unlink(missing_ok=True)
    (ws.root / ".state/kiro.db").mkdir()
    r = ws.run("loop", "history")
    assert r.returncode == 1 and "Traceback" not in r.stderr and "internal error" not in r.stderr, r.stderr
    assert r.stderr.startswith("kiro: the history index .state/kiro.db cannot be opened") and "move it away" in r.stderr
    (ws.root / ".state/kiro.db").rmdir()
    assert [x["kind"] for x in _history(ws, "--task-id", "one")].count("attempt") == 1  # moved away: rebuilt
