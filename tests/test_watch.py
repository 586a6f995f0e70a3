"""`kiro loop watch`: starts task files dropped into Specs/, never runs one task twice at once, keeps
paused loops and continues them when their hook is deleted or their task is moved back."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Workspace, shell_task

SLOW = 'echo "$KIRO_TASK_ID $KIRO_STEP_ID" >> side_effects.log; sleep 0.2'


@pytest.fixture
def watch(ws: Workspace) -> Iterator[subprocess.Popen[str]]:
    proc = ws.spawn("loop", "watch", "--max-parallel", "2")
    ws.wait_for(lambda: (ws.root / ".state/watch.pid").exists(), what="watch started")
    yield proc
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)


def _ids_by_path(ws: Workspace) -> dict[str, str]:
    import json

    out = {}
    for p in list((ws.root / ".state").glob("autonomous_loop_*.json")) + list(
            (ws.root / ".state/archive").glob("autonomous_loop_*.json")):
        try:
            st = json.loads(p.read_text())
        except ValueError:
            continue
        out[st["task_path"].split("/")[1]] = st["task_id"]
    return out


def test_watch_starts_task_files_dropped_into_specs(ws: Workspace, watch: subprocess.Popen[str]) -> None:
    ws.task(shell_task(2), "Specs/alpha/tasks.md")
    ws.task(shell_task(3), "Specs/beta/tasks.md")
    ws.write("Specs/beta/requirements.md", "# not a task file\n- [ ] not a step of any loop\n")
    ws.wait_for(lambda: (ws.root / "Done/alpha/tasks.md").exists() and (ws.root / "Done/beta/tasks.md").exists(),
                what="both tasks done", timeout=60)
    runs = (ws.root / "side_effects.log").read_text().split()
    assert sorted(runs) == ["1", "1", "2", "2", "3"]
    assert (ws.root / "Specs/beta/requirements.md").exists()  # left alone
    # a third file dropped later is picked up too
    ws.task(shell_task(1, cmd="echo gamma >> gamma.log"), "Specs/gamma/tasks.md")
    ws.wait_for(lambda: (ws.root / "Done/gamma/tasks.md").exists(), what="gamma done", timeout=60)
    assert watch.poll() is None


def test_watch_never_runs_a_task_twice_and_respects_max_parallel(ws: Workspace) -> None:
    for name in ("a", "b", "c"):
        ws.task(shell_task(3, cmd='echo "start $(date +%s.%N) $KIRO_TASK_ID" >> spans.log; sleep 0.4; '
                                  'echo "end $(date +%s.%N) $KIRO_TASK_ID" >> spans.log'), f"Specs/{name}/tasks.md")
    # one of them is already running in another process
    other = ws.spawn("loop", "start", "--task", "Specs/a/tasks.md", "--task-id", "outside")
    ws.wait_for(lambda: ws.state("outside")["iteration"] >= 1, what="outside loop running")
    proc = ws.spawn("loop", "watch", "--max-parallel", "2")
    try:
        ws.wait_for(lambda: all((ws.root / f"Done/{n}/tasks.md").exists() for n in "abc"), timeout=90,
                    what="all done")
        assert other.wait(timeout=30) == 0
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    spans: dict[str, list[tuple[float, float]]] = {}
    starts: dict[str, float] = {}
    for line in (ws.root / "spans.log").read_text().splitlines():
        kind, ts, tid = line.split()
        if kind == "start":
            starts[tid] = float(ts)
        else:
            spans.setdefault(tid, []).append((starts.pop(tid), float(ts)))
    assert "outside" in spans and len(spans) == 3  # a ran only as "outside", never also under watch
    assert sum(len(v) for v in spans.values()) == 9
    watched = [s for tid, v in spans.items() if tid != "outside" for s in v]
    for t0, _ in watched:  # the supervisor's own loops: at most 2 at any moment
        assert sum(1 for a, b in watched if a <= t0 < b) <= 2


def test_paused_loop_continues_when_its_hook_is_deleted(ws: Workspace, watch: subprocess.Popen[str]) -> None:
    ws.task(shell_task(12, cmd=SLOW), "Specs/alpha/tasks.md")
    ids = ws.wait_for(lambda: _ids_by_path(ws).get("alpha"), what="loop created")
    ws.wait_for(lambda: ws.state(ids)["iteration"] >= 1, what="running")
    r = ws.run("loop", "stop", "--task-id", ids)
    assert r.returncode == 0
    ws.wait_for(lambda: ws.state(ids)["status"] == "paused", what="paused")
    st = ws.run("loop", "status", "--task-id", ids, "--json")
    assert '"status": "paused"' in st.stdout
    frozen = ws.state(ids)["iteration"]
    time.sleep(0.5)
    assert ws.state(ids)["iteration"] == frozen  # paused means paused
    (ws.root / ".hooks" / f"stop_autonomous_loop_{ids}.md").unlink()  # by hand
    ws.wait_for(lambda: (ws.root / "Done/alpha/tasks.md").exists(), what="continued to the end", timeout=60)
    lines = (ws.root / "side_effects.log").read_text().splitlines()
    assert len(lines) == len(set(lines)) == 12  # nothing ran twice


def test_paused_loop_continues_when_task_is_moved_back_from_needs_action(ws: Workspace,
                                                                          watch: subprocess.Popen[str]) -> None:
    ws.task(shell_task(12, cmd=SLOW), "Specs/alpha/tasks.md")
    tid = ws.wait_for(lambda: _ids_by_path(ws).get("alpha"), what="loop created")
    ws.wait_for(lambda: ws.state(tid)["iteration"] >= 1, what="running")
    (ws.root / "Needs_Action/alpha").mkdir(parents=True)
    os.replace(ws.root / "Specs/alpha/tasks.md", ws.root / "Needs_Action/alpha/tasks.md")
    ws.wait_for(lambda: ws.state(tid)["stop_reason"] == "needs_action", what="paused for a person")
    time.sleep(0.3)
    assert not (ws.root / "Specs/alpha/tasks.md").exists()  # the supervisor does not start it again
    os.replace(ws.root / "Needs_Action/alpha/tasks.md", ws.root / "Specs/alpha/tasks.md")
    ws.wait_for(lambda: ws.state(tid)["status"] == "completed", what="continued to the end", timeout=60)
    assert (ws.root / "Done/alpha/tasks.md").exists()


def test_resume_of_a_loop_kept_by_watch_hands_it_back(ws: Workspace, watch: subprocess.Popen[str]) -> None:
    ws.task(shell_task(12, cmd=SLOW), "Specs/alpha/tasks.md")
    tid = ws.wait_for(lambda: _ids_by_path(ws).get("alpha"), what="loop created")
    ws.wait_for(lambda: ws.state(tid)["iteration"] >= 1, what="running")
    assert ws.run("loop", "stop", "--task-id", tid).returncode == 0
    ws.wait_for(lambda: ws.state(tid)["status"] == "paused", what="paused")
    r = ws.kiro("loop", "resume", "--task-id", tid)
    assert r.returncode == 0, r.stderr
    assert "kiro loop watch" in r.stdout
    ws.wait_for(lambda: (ws.root / "Done/alpha/tasks.md").exists(), what="continued by watch", timeout=60)


def test_a_second_watch_on_the_same_workspace_is_refused(ws: Workspace, watch: subprocess.Popen[str]) -> None:
    r = ws.kiro("loop", "watch")
    assert r.returncode == 1 and f"process {watch.pid}" in r.stderr


def test_watch_names_every_folder_waits_for_a_file_being_copied_and_says_when_it_stops(ws: Workspace) -> None:
    """Issue #38 item 14: `watch` said "watching Specs" but also ran .kiro/specs; it printed "skipped ... no steps
    found" for a task file still being copied, then started it in the same second; Ctrl-C printed nothing."""
    proc = ws.spawn("loop", "watch")
    try:
        ws.wait_for(lambda: (ws.root / ".state/watch.pid").exists(), what="watch started")
        copying = ws.root / "Specs/copied/tasks.md"
        full = shell_task(1, cmd="echo copied >> copied.log")
        head = full[: full.index("# Plan")]  # the frontmatter arrived, the steps not yet
        copying.parent.mkdir(parents=True)
        copying.write_text(head)
        ws.task(shell_task(1, cmd="true"), "Specs/probe/tasks.md")  # a scan sees both files

        def probe_seen() -> bool:
            copying.write_text(head)  # still being written: its time stays fresh
            return bool(list((ws.root / ".state").rglob("autonomous_loop_*.json")))

        ws.wait_for(probe_seen, what="a scan that saw the half-copied file")
        copying.write_text(full)
        ws.wait_for(lambda: (ws.root / "Done/copied/tasks.md").exists(), what="the copied task done", timeout=90)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = ws.output(proc)
    print(out)
    first = out.splitlines()[0]
    assert "Specs/" in first and ".kiro/specs/*/tasks.md" in first, first
    assert "skipped" not in out and "no steps" not in out
    assert (ws.root / "copied.log").read_text() == "copied\n"
    assert out.rstrip().splitlines()[-1].startswith("stopped watching")
