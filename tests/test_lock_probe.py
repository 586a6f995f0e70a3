"""Probing a lock never takes it (issue 7 item 8): `status`, the dashboard, `--detach` polling and
`logs --follow` ask "is this loop alive?" all the time; a `start` that arrives while they ask must
not fail with "already running"."""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kiro.core.supervisor import check_watch_free
from kiro.errors import LockHeld, StateError, UserError
from kiro.fs.locks import Flock, Timeout
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace as KiroWorkspace
from tests.conftest import Workspace, shell_task

HOLDER_PRELUDE = ("import pathlib, subprocess, sys, time\nfrom kiro.store.statestore import StateStore\n"
                  "from kiro.store.workspace import Workspace\n"
                  "store = StateStore(Workspace(pathlib.Path(sys.argv[1])))\n")


@contextlib.contextmanager
def holder_process(ws: Workspace, body: str, *, stdin: bool = False) -> Iterator[subprocess.Popen[str]]:
    """Another process that runs `body` (after HOLDER_PRELUDE: `store` is the workspace's StateStore),
    killed at the end."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDER_PRELUDE + body, str(ws.root)],
                            stdin=subprocess.PIPE if stdin else None, stdout=subprocess.PIPE, text=True, env=ws.env())
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stdin):
            if stream is not None:
                stream.close()


def test_a_tight_prober_never_makes_acquire_fail(ws: Workspace) -> None:
    store = StateStore(KiroWorkspace(ws.root))
    store.release("p", store.acquire("p"))  # the lock file exists, as after any earlier run
    stop = threading.Event()
    probes = 0

    def prober() -> None:
        nonlocal probes
        while not stop.is_set():
            store.is_locked("p")
            probes += 1

    threads = [threading.Thread(target=prober) for _ in range(2)]
    for t in threads:
        t.start()
    failures = 0
    try:
        for _ in range(400):
            try:
                lock = store.acquire("p")
            except LockHeld:
                failures += 1
                continue
            store.release("p", lock)
    finally:
        stop.set()
        for t in threads:
            t.join()
    print(f"400 acquires against {probes} probes: {failures} false 'already running'")
    assert probes > 0
    assert failures == 0


def test_the_probe_sees_a_holder_in_another_process_and_its_death(ws: Workspace) -> None:
    kws = KiroWorkspace(ws.root)
    store = StateStore(kws)
    assert not store.is_locked("q")  # no lock file at all
    with holder_process(ws, "lock = store.acquire('q')\nprint('held', flush=True)\ntime.sleep(60)\n") as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert store.is_locked("q")
        assert store.holder_pid("q") == holder.pid
        try:
            store.acquire("q")
            raise AssertionError("acquired a lock another process holds")
        except LockHeld as exc:
            assert str(holder.pid) in str(exc)
    assert not store.is_locked("q")  # the lock died with its process
    store.release("q", store.acquire("q"))


def test_a_lock_whose_taker_was_killed_is_waited_for_while_a_child_of_it_still_holds_a_copy(ws: Workspace) -> None:
    """kiro killed (-9) while it starts a step: the child, caught between its fork and its exec, holds a copy
    of every lock kiro had until its exec closes it (CI, stop 52: a resume right after the kill failed with
    "already running in process N", N the dead kiro). A resume then waits a moment for that copy to go; a copy
    still held after it gets a message that says the lock's taker has ended and which file is held (the same
    message as for a --detach start's loop before it takes its lock over: tests/test_detach.py)."""
    store = StateStore(KiroWorkspace(ws.root))
    body = ("import os\nlock = store.acquire('q')\npid = os.fork()\n"
            "if pid == 0:\n    time.sleep(float(sys.argv[2]))\n    os._exit(0)\n"
            "print(pid, flush=True)\nos._exit(0)\n")
    for hold, waits in ((0.5, True), (30.0, False)):
        taker = subprocess.Popen([sys.executable, "-c", HOLDER_PRELUDE + body, str(ws.root), str(hold)],
                                 stdout=subprocess.PIPE, text=True, env=ws.env())
        assert taker.stdout is not None
        child = int(taker.stdout.readline())
        taker.stdout.close()
        taker.wait()  # the taker is gone; its child holds the lock for `hold` seconds
        try:
            assert store.is_locked("q")
            if waits:
                store.release("q", store.acquire("q"))  # within the wait: no "already running"
                print(f"a copy held {hold} s after its taker ended: waited for, then taken")
            else:
                with pytest.raises(LockHeld) as caught:
                    store.acquire("q")
                message = str(caught.value)
                assert f"taken by process {taker.pid}, which has ended" in message, message
                assert ".state/autonomous_loop_q.lock" in message, message
                assert "already running in another process" in message, message
                print(f"a copy held {hold} s: {message}")
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
    ws.wait_for(lambda: not store.is_locked("q"), timeout=30, what="the child's copy to go")
    store.release("q", store.acquire("q"))


def test_the_holder_is_named_in_the_lock_file_and_the_kernel_has_the_last_word(ws: Workspace) -> None:
    """A loop's holder (pid, host, role) is written into its lock file: no `.pid` file beside it (one
    new file less per start). The pid `kiro loop stop --force` signals comes from the kernel's lock
    table: one planted in the file names nobody. The file is removed when the lock is let go."""
    kws = KiroWorkspace(ws.root)
    store = StateStore(kws)
    lock_file = ws.root / ".state" / "autonomous_loop_q.lock"
    with holder_process(ws, "lock = store.acquire('q', role='watch')\nprint('held', flush=True)\n"
                        "sys.stdin.readline()\nstore.release('q', lock)\nprint('let go', flush=True)\n"
                        "time.sleep(60)\n", stdin=True) as holder:
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "held"
        assert not list((ws.root / ".state").glob("*.pid"))
        assert lock_file.read_text().split()[0] == str(holder.pid)
        assert store.holder_role("q") == "watch"
        lock_file.write_text("1\nelsewhere\nloop\n")  # a pid planted by someone who may write there
        assert store.holder_pid("q") == holder.pid
        holder.stdin.write("go\n")
        holder.stdin.flush()
        assert holder.stdout.readline().strip() == "let go"
        assert not lock_file.exists()  # no `.lock` file per finished loop piles up in .state/
        assert store.holder_pid("q") is None and store.holder_role("q") is None


def test_a_batch_start_writes_no_pid_file_and_names_the_holder(ws: Workspace) -> None:
    seen = 'cat "$KIRO_WORKSPACE/.state/autonomous_loop_$KIRO_TASK_ID.lock" > "$KIRO_WORKSPACE/holder_$KIRO_TASK_ID"'
    ws.task(shell_task(1, cmd=seen))
    ws.task(shell_task(1, cmd=seen), rel="Specs/other/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task", "Specs/other/tasks.md")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list((ws.root / ".state").glob("*.pid"))
    named = [p.read_text().split() for p in ws.root.glob("holder_*")]
    assert len(named) == 2 and all(n[0].isdigit() and n[2] == "loop" for n in named), named  # while it ran
    assert not list((ws.root / ".state").glob("autonomous_loop_*.lock"))  # removed at the end


def test_watch_probe_does_not_take_the_watch_lock(ws: Workspace) -> None:
    """`start`/`resume` check that no `kiro loop watch` runs; that check must not block a watch that starts."""
    kws = KiroWorkspace(ws.root)
    path = ws.root / ".state" / "watch.lock"
    path.touch()
    stop = threading.Event()

    def prober() -> None:
        while not stop.is_set():
            with contextlib.suppress(UserError):  # the lock is held right now: "watch already runs"
                check_watch_free(kws)

    t = threading.Thread(target=prober)
    t.start()
    failures = 0
    try:
        for _ in range(300):
            lock = Flock(path)
            try:
                lock.acquire()
            except Timeout:
                failures += 1
                continue
            lock.release()
    finally:
        stop.set()
        t.join()
    assert failures == 0


def test_a_loops_lock_is_not_inherited_by_a_program_its_holder_started(ws: Workspace) -> None:
    """The lock dies with kiro even when a program kiro started lives on (kiro.fs.locks.Flock: the
    file's descriptor closes on exec), or that program would keep the loop "running" forever."""
    store = StateStore(KiroWorkspace(ws.root))
    with holder_process(ws, "lock = store.acquire('c')\nchild = subprocess.Popen(['sleep', '60'], close_fds=False)\n"
                            "print(child.pid, flush=True)\ntime.sleep(60)\n") as holder:
        assert holder.stdout is not None
        child = int(holder.stdout.readline())
        assert store.is_locked("c")
    try:
        os.kill(child, 0)  # the program lives on
        assert not store.is_locked("c")
        store.release("c", store.acquire("c"))
    finally:
        os.kill(child, signal.SIGKILL)


def test_acquire_waits_for_a_holder_that_lets_go_and_names_one_that_does_not(ws: Workspace) -> None:
    store = StateStore(KiroWorkspace(ws.root))
    first = store.acquire("w")
    timer = threading.Timer(0.3, store.release, ("w", first))
    timer.start()
    try:
        second = store.acquire("w", wait_seconds=10)  # waits about 0.3 s
    finally:
        timer.join()
    try:
        with pytest.raises(LockHeld, match=str(os.getpid())):
            store.acquire("w", wait_seconds=0.2)
    finally:
        store.release("w", second)
    (ws.root / ".state" / "autonomous_loop_d.lock").mkdir()
    with pytest.raises(StateError, match=r"cannot create the lock file \.state/autonomous_loop_d\.lock"):
        store.acquire("d")


def test_a_start_waits_for_the_start_guard_held_by_another_kiro(ws: Workspace) -> None:
    """The start guard (.state/.start.lock) is kiro's own flock now, not filelock's: a guard held by
    another process (a plain flock, as an older kiro took it through filelock) still makes `kiro loop
    start` wait for it, and the start goes on once it is let go."""
    ws.task(shell_task(1))
    guard = ws.root / ".state" / ".start.lock"
    guard.parent.mkdir(parents=True, exist_ok=True)
    held = os.open(guard, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    try:
        proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "guarded")
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=2)
        assert not (ws.root / "Logs" / "guarded.jsonl").exists()  # no loop yet
    finally:
        os.close(held)
    assert proc.wait(timeout=60) == 0, ws.output(proc)
    assert "completed" in ws.output(proc) and (ws.root / "Logs" / "completion_reports" / "guarded.md").exists()


def test_a_waiter_that_locks_a_removed_lock_file_does_not_hold_the_lock(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The race a removed lock file opens: B opened the file before its holder A removed it and let
    go, so B's flock succeeds on the removed file while C holds the new one. B must see that the path
    names another file now and wait for C, not hold "the lock" beside C."""
    from kiro.fs import locks as lk

    path = tmp_path / "autonomous_loop_x.lock"
    a = lk.Flock(path)
    a.acquire()
    stale = os.open(path, os.O_RDWR)  # B's open, before A removes the file
    a.clear()
    a.remove()
    a.release()
    assert not path.exists()
    c = lk.Flock(path)
    c.acquire()  # the next holder makes the file again
    real_open, opened = os.open, []

    def b_open(p: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        if os.fspath(p) == str(path) and not opened:
            opened.append(p)
            return stale  # B's stale descriptor: its flock succeeds (nobody holds the removed file)
        return real_open(p, flags, mode, **kw)

    monkeypatch.setattr(lk.os, "open", b_open)
    b = lk.Flock(path)
    with pytest.raises(lk.Timeout):
        b.acquire(timeout=0.3, poll=0.01)
    monkeypatch.undo()
    assert opened and lk.holder_pid(path) == os.getpid()
    c.release()
    b.acquire()  # and once C lets go, B gets the file the path names
    assert b._still_named(b._fd)  # type: ignore[arg-type]
    b.release()


def test_a_symlink_in_place_of_a_lock_file_is_refused_and_its_target_left_alone(ws: Workspace) -> None:
    """Every lock kiro takes is a `Flock`, which never follows a symlink: a person's file linked where a
    loop's lock file (or watch.lock) goes is neither locked nor emptied when the lock is let go (it was,
    through the link), and the command says in one line which file is in the way."""
    ws.task(shell_task(1))
    mine = ws.root / "notes.txt"
    mine.write_text("a person's notes\n")
    lock = ws.root / ".state" / "autonomous_loop_linked.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    lock.symlink_to(mine)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "linked")
    print(r.stdout + r.stderr)
    assert r.returncode == 1
    assert "the lock file .state/autonomous_loop_linked.lock is a symlink" in r.stderr
    assert "Traceback" not in r.stderr
    assert mine.read_text() == "a person's notes\n" and lock.is_symlink()
    watch_lock = ws.root / ".state" / "watch.lock"
    watch_lock.symlink_to(mine)
    r = ws.kiro("loop", "watch")
    print(r.stdout + r.stderr)
    assert r.returncode == 1
    assert "cannot take the lock .state/watch.lock (Too many levels of symbolic links)" in r.stderr
    assert "Traceback" not in r.stderr and "internal error" not in r.stderr
    assert mine.read_text() == "a person's notes\n"


def test_a_second_workspace_worker_names_the_process_that_holds_its_lock(ws: Workspace) -> None:
    """The temporal workspace worker's lock is a `Flock` too: a second `kiro worker --role workspace`
    refuses in one line that names the holder's pid (read from the kernel's lock table), and the
    probe `kiro loop start` uses sees the holder without taking its lock."""
    from kiro.temporal.client import workspace_worker_running

    ws.write("config/autonomous_loop.yaml", "backend:\n  kind: temporal\n  address: 127.0.0.1:9\n")
    kws = KiroWorkspace(ws.root)
    assert not workspace_worker_running(kws)
    body = ("from kiro.fs.locks import Flock\nlock = Flock(pathlib.Path(sys.argv[1]) / '.state' / "
            "'temporal_worker.lock')\nlock.acquire()\nprint('held', flush=True)\ntime.sleep(60)\n")
    (ws.root / ".state").mkdir(exist_ok=True)
    with holder_process(ws, body) as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        assert workspace_worker_running(kws)
        r = ws.kiro("worker", "--role", "workspace", "-w", str(ws.root))
        print(r.stderr)
        assert r.returncode == 1
        assert f"a workspace worker already runs for {ws.root} (pid {holder.pid}, which holds " \
               f".state/temporal_worker.lock); one per workspace" in r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        assert workspace_worker_running(kws)  # still held: the probe took nothing
    assert not workspace_worker_running(kws)  # the lock died with its holder



# another process lets go of its locks one after another, then takes them all again, over and over: each
# one it lets go moves every line after it in /proc/locks up by one
CHURN = ("import fcntl, sys\nfds = [int(fd) for fd in sys.argv[1:]]\nprint('churning', flush=True)\nwhile True:\n"
         "    for fd in fds:\n        fcntl.flock(fd, fcntl.LOCK_UN)\n"
         "    for fd in fds:\n        fcntl.flock(fd, fcntl.LOCK_EX)\n")


def test_a_held_lock_is_seen_held_while_other_processes_let_theirs_go(tmp_path: Path) -> None:
    """The kernel hands /proc/locks out a page per read, each going on from the line number the last one
    reached: a lock let go in between moves every later line up, and the line at the seam is not shown. A
    probe that took one reading for the whole truth said a held lock was free now and then on a busy
    machine (`stop --force` then took a process ignoring SIGTERM for one that had stopped): on a9d3925, 17
    probes in 300 said so, twice."""
    from kiro.fs import locks

    held, churned = [], []
    for i in range(1000):  # every 14th lock is held here all along, the others change hands
        lock = Flock(tmp_path / f"{i}.lock")
        lock.acquire()
        (held if i % 14 == 0 else churned).append(lock)
    fds = [lock.fd for lock in churned]
    churner = subprocess.Popen([sys.executable, "-c", CHURN, *map(str, fds)], pass_fds=fds, stdout=subprocess.PIPE,
                               text=True)
    try:
        assert churner.stdout is not None and churner.stdout.readline().strip() == "churning"
        missed = [i for i in range(300) if not locks.is_held(Path(held[i % len(held)].path))]
    finally:
        churner.kill()
        churner.wait()
        if churner.stdout is not None:
            churner.stdout.close()
        for lock in held + churned:
            lock.release()
    print(f"300 probes of held locks while another process let go of and took {len(churned)} locks: "
          f"{len(missed)} said free")
    assert missed == []


class _CountedTable:
    """/proc/locks, its readings counted."""

    def __init__(self) -> None:
        self.reads = 0

    def read_bytes(self) -> bytes:
        self.reads += 1
        return Path("/proc/locks").read_bytes()


@pytest.mark.skipif(not Path("/proc/locks").exists(), reason="no kernel lock table to read (not Linux)")
def test_the_dashboard_and_stats_of_many_loops_read_the_lock_table_once_and_say_what_each_probe_says(
        ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dashboard or a digest of a thousand loops asked each one's lock apart: a thousand readings of a
    thousand-line /proc/locks each time. One reading (three for a lock missing from a table read in pieces, as
    a probe does) says the same of every loop: running while its lock is held, interrupted when it is not."""
    from kiro.fs import locks
    from kiro.store.state import LoopState
    from kiro.views import dashboard, stats

    kws = KiroWorkspace(ws.root)
    store = StateStore(kws)
    held = []
    for i in range(40):
        tid = f"l{i}"
        store.save(LoopState.model_validate({"task_id": tid, "task_path": f"Specs/{tid}/tasks.md",
                                             "status": "running", "pid": os.getpid()}))
        if i % 3 == 0:
            held.append(store.acquire(tid))
        else:
            kws.lock_file(tid).touch()  # a lock file nobody holds, as after a kill
    others = [Flock(ws.root / f"other{i}.lock") for i in range(120)]  # a table longer than a page
    for lock in others:
        lock.acquire()
    table = _CountedTable()
    monkeypatch.setattr(locks, "PROC_LOCKS", table)
    try:
        probed = {f"l{i}" for i in range(40) if store.is_locked(f"l{i}")}
        assert probed == {f"l{i}" for i in range(0, 40, 3)} and table.reads >= 40  # a reading each, or three
        table.reads = 0
        assert store.locked([f"l{i}" for i in range(40)] + ["none"]) == probed
        assert table.reads <= locks.READINGS
        table.reads = 0
        text = dashboard.render(kws, store, {})
        assert table.reads <= locks.READINGS
        assert f"## Active Loops ({len(probed)})" in text and f"## Paused ({40 - len(probed)})" in text
        table.reads = 0
        figures = stats.compute(store)
        assert table.reads <= locks.READINGS
        assert figures["by_status"] == {"interrupted": 40 - len(probed), "running": len(probed)}
    finally:
        for lock in others:
            lock.release()
        for i, lock in zip(range(0, 40, 3), held, strict=True):
            store.release(f"l{i}", lock)


def test_without_a_lock_table_the_loops_are_probed_by_taking_and_letting_go(ws: Workspace,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Where there is no /proc/locks (not Linux), `StateStore.locked` says what `is_locked` says of each loop: the
    try-and-release check."""
    from kiro.fs import locks

    class NoTable:
        def read_bytes(self) -> bytes:
            raise FileNotFoundError("/proc/locks")

    store = StateStore(KiroWorkspace(ws.root))
    kws = KiroWorkspace(ws.root)
    kws.state_dir.mkdir(parents=True, exist_ok=True)
    kws.lock_file("free").touch()
    with holder_process(ws, "lock = store.acquire('taken')\nprint('held', flush=True)\ntime.sleep(60)\n") as holder:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(locks, "PROC_LOCKS", NoTable())
        assert [store.is_locked(t) for t in ("taken", "free", "none")] == [True, False, False]
        assert store.locked(["taken", "free", "none"]) == {"taken"}
