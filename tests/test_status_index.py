"""The status index (issue #12, kiro.statusindex): `kiro loop status` answers from `.state/status_index`
when no loop's summary changed, byte for byte what the full CLI prints, and reads the loops again
whenever anything could have changed: a new save, an in-place rewrite that kept size and mtime, a
lock taken, a loop added or gone, a broken or foreign index."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kiro import journal
from tests.conftest import Workspace, shell_task
from tests.test_command_executor import agent_task, make_agent, runs

TASK = "Specs/feature/tasks.md"
INDEX = ".state/status_index"
READS = [("loop", "status"), ("loop", "status", "--json")]


def age(ws: Workspace) -> None:
    """Let every file in .state/ be more than a second old: the index keeps only rows of files whose
    last change (mtime and ctime) is older than that (a change within the same clock tick as the read
    could not be told apart)."""
    time.sleep(1.2)


def fast(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    return ws.kiro(*args, env=ws.env(KIRO_FAST_READ_STRICT="1"))


def full(ws: Workspace, *args: str) -> subprocess.CompletedProcess[str]:
    return ws.kiro(*args, env=ws.env(KIRO_NO_FAST_READ="1"))


def assert_same(ws: Workspace) -> None:
    for args in READS:
        a, b = fast(ws, *args), full(ws, *args)
        assert (a.returncode, a.stdout, a.stderr) == (b.returncode, b.stdout, b.stderr), args


def rows(ws: Workspace) -> dict[str, dict[str, object]]:
    r = fast(ws, "loop", "status", "--json")
    assert r.returncode == 0, r.stderr
    return {row["task_id"]: row for row in json.loads(r.stdout)}


def indexed(ws: Workspace) -> set[str]:
    """The task ids whose rows the index holds."""
    lines = (ws.root / INDEX).read_bytes().split(b"\n")
    return {row["task_id"] for row in json.loads(lines[2]).values()}


@pytest.fixture
def loops(ws: Workspace) -> Workspace:
    """Three loops: one completed, one stopped at max_iterations, one paused by its hook; files aged."""
    ws.task(shell_task(3))
    assert ws.kiro("loop", "start", "--task", TASK, "--task-id", "done1").returncode == 0
    ws.task(shell_task(3), rel="Specs/other/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "half",
                   "--max-iterations", "1").returncode == 4
    ws.task(shell_task(2), rel="Specs/third/tasks.md")
    (ws.root / ".hooks" / "stop_autonomous_loop_held.md").write_text("stop\n")
    assert ws.kiro("loop", "start", "--task", "Specs/third/tasks.md", "--task-id", "held").returncode == 3
    assert full(ws, "loop", "status").returncode == 0  # records the checked config for the fast path
    age(ws)
    return ws


def test_status_answers_from_the_index_byte_for_byte(loops: Workspace) -> None:
    ws = loops
    assert_same(ws)  # the first one writes the index
    assert indexed(ws) == {"done1", "half", "held"}
    before = (ws.root / INDEX).read_bytes()
    assert_same(ws)  # answered from it
    assert (ws.root / INDEX).read_bytes() == before  # nothing new: not rewritten


def test_a_loop_that_ran_again_shows_its_new_state(loops: Workspace) -> None:
    ws = loops
    assert_same(ws)
    assert rows(ws)["half"]["status"] == "max_iterations"
    r = ws.kiro("loop", "resume", "--task-id", "half", "--max-iterations", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert rows(ws)["half"]["status"] == "completed"
    assert_same(ws)


def test_an_in_place_rewrite_that_keeps_size_and_mtime_is_seen(loops: Workspace) -> None:
    """The summary is rewritten in place (kiro.journal.SummaryWriter): same size, and here the same
    mtime set back by hand. Its ctime still moves: the index does not answer for it."""
    ws = loops
    assert_same(ws)
    path = ws.root / ".state/autonomous_loop_half.summary"
    st = path.stat()
    summary = journal.decode_summary(path.read_bytes())
    assert summary is not None and summary["iteration"] == 1
    summary["iteration"] = 7
    data = journal.encode_summary(summary)
    assert len(data) <= st.st_size
    with open(path, "r+b") as fh:
        fh.write(data + b" " * (st.st_size - len(data)))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns == st.st_mtime_ns
    assert rows(ws)["half"]["iteration"] == 7
    (ws.root / INDEX).unlink()
    assert rows(ws)["half"]["iteration"] == 7  # what a scan without the index reads


def test_a_lock_taken_since_is_a_live_loop_not_the_indexed_interrupted_row(ws: Workspace) -> None:
    """A loop recorded `running` whose process is gone reads as interrupted, and the index keeps
    that row; once some process holds its lock again (here flock(1)), it reads as running."""
    ws.task(shell_task(1, cmd="sleep 60"))
    proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", TASK, "--task-id", "live"],
                            cwd=ws.root, env=ws.env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    summary = ws.root / ".state/autonomous_loop_live.summary"
    ws.wait_for(lambda: summary.exists() and b'"status":"running"' in summary.read_bytes()
                and b'"current_step":{' in summary.read_bytes(), what="the loop running its step")
    proc.kill()
    proc.wait()
    assert full(ws, "loop", "status").returncode == 0
    age(ws)
    assert rows(ws)["live"]["status"] == "interrupted"
    assert rows(ws)["live"]["status"] == "interrupted"  # from the index
    assert "live" in indexed(ws)
    holder = subprocess.Popen(["flock", str(ws.root / ".state/autonomous_loop_live.lock"), "sleep", "60"],
                              start_new_session=True)
    try:
        ws.wait_for(lambda: "FLOCK" in Path("/proc/locks").read_text()
                    and str((ws.root / ".state/autonomous_loop_live.lock").stat().st_ino)
                    in Path("/proc/locks").read_text(), what="flock holding the lock")
        row = rows(ws)["live"]
        assert row["status"] == "running" and row["alive"] is True
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # flock and its sleep, which holds the lock too
        holder.wait()
    assert rows(ws)["live"]["status"] == "interrupted"


def test_loops_added_and_gone_and_a_global_hook_change_the_answer(loops: Workspace) -> None:
    ws = loops
    assert_same(ws)
    ws.task(shell_task(1), rel="Specs/fourth/tasks.md")
    assert ws.kiro("loop", "start", "--task", "Specs/fourth/tasks.md", "--task-id", "fourth").returncode == 0
    assert set(rows(ws)) == {"done1", "half", "held", "fourth"}
    assert_same(ws)
    gone = list((ws.root / ".state").rglob("autonomous_loop_fourth.*"))
    assert gone
    for p in gone:  # the loop's files, wherever they are (a completed loop's are archived)
        p.unlink()
    assert set(rows(ws)) == {"done1", "half", "held"}
    assert_same(ws)
    (ws.root / ".hooks/stop_autonomous_loop.md").write_text("stop all\n")  # changes every resumable row's hint
    assert_same(ws)
    assert any(row["hint"] == "kiro loop resume --all" for row in rows(ws).values())


@pytest.mark.parametrize("content", [b"", b"garbage\n", b"kiro-status-index 2\n{\"head\": 1}\n",
                                     b"kiro-status-index 2\n[]\n[]\n", b"\xff\xfe\x00" * 100])
def test_a_broken_or_foreign_index_costs_a_scan_never_a_wrong_answer(loops: Workspace, content: bytes) -> None:
    ws = loops
    assert_same(ws)
    (ws.root / INDEX).write_bytes(content)
    assert_same(ws)
    assert indexed(ws) == {"done1", "half", "held"}  # written again, whole
    whole = (ws.root / INDEX).read_bytes()
    (ws.root / INDEX).write_bytes(whole[:-40])  # the kept table cut short: its span no longer fits
    assert_same(ws)


def test_an_agent_running_status_in_its_step_is_not_blamed_and_its_index_is_not_kept(ws: Workspace) -> None:
    """An agent that runs `kiro loop status` during its step (or writes the index itself) is not
    blamed, and its index is not kept: the control-file check deletes it."""
    ws.task(agent_task(1))
    out = make_agent(ws, """\
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "status"], capture_output=True, text=True)
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "status"], capture_output=True, text=True)
        log("status.txt", r.stdout)
        check_box()
        """)
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "agent")
    assert r.returncode == 0, r.stdout + r.stderr
    assert runs(out) == ["1 1"]  # one attempt: nothing blamed on the agent
    assert "agent" in (out / "status.txt").read_text()
    assert not (ws.root / INDEX).exists()
    assert ws.state("agent")["total_failures"] == 0
