"""`kiro loop stop --all` / `kiro loop resume --all` (issue 7 item 6, SPEC §3): the global hook pauses
every loop, says truthfully how to continue, and `resume --all` removes it and continues every paused
loop; `resume --task-id X` while the global hook is there says what to do instead of pausing again."""

from __future__ import annotations

import json

import pytest

from tests.conftest import Workspace, new_workspace, shell_task

# While `held` is there, a step runs until the global hook appears: both loops are mid-step when `stop --all`
# comes, whatever the machine's load; once it is gone (the loops paused), steps take no time.
SLOW = ('echo "$KIRO_STEP_ID" >> "side_$KIRO_TASK_ID.log"; '
        'while [ -e held ] && [ ! -e .hooks/stop_autonomous_loop.md ]; do sleep 0.02; done')
STEPS = 5


def _two_paused_loops(ws: Workspace) -> None:
    ws.task(shell_task(STEPS, cmd=SLOW), "Specs/a/tasks.md")
    ws.task(shell_task(STEPS, cmd=SLOW), "Specs/b/tasks.md")
    ws.write("held", "")
    procs = [ws.spawn("loop", "start", "--task", f"Specs/{n}/tasks.md", "--task-id", n) for n in "ab"]
    try:
        for n in "ab":
            ws.wait_for(lambda n=n: ws.state(n)["iteration"] >= 1, what=f"loop {n} running")
        r = ws.run("loop", "stop", "--all")
        assert r.returncode == 0, r.stderr
        assert "kiro loop resume --all" in r.stdout
        for p in procs:
            assert p.wait(timeout=30) == 3, Workspace.output(p)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for n in "ab":
        assert ws.state(n)["status"] == "paused"
    (ws.root / "held").unlink()


@pytest.fixture(scope="module")
def paused(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    """Two loops paused by `stop --all`, shared by the tests that only read them (or are refused)."""
    ws = new_workspace(tmp_path_factory.mktemp("paused") / "vault")
    _two_paused_loops(ws)
    return ws


def test_the_global_hook_tells_the_truth(paused: Workspace) -> None:
    ws = paused
    hook = (ws.root / ".hooks/stop_autonomous_loop.md").read_text()
    assert "kiro loop resume --all" in hook
    assert "--task-id *" not in hook
    assert "No state recorded" not in hook
    event = [e for e in ws.events("a") if e["event"] == "stop_condition"][-1]
    assert "kiro loop resume --all" in event["message"]
    status = json.loads(ws.run("loop", "status", "--task-id", "a", "--json").stdout)
    assert status["hint"] == "kiro loop resume --all"


def test_resume_all_removes_the_global_hook_and_continues_every_paused_loop(ws: Workspace) -> None:
    _two_paused_loops(ws)
    r = ws.kiro("loop", "resume", "--all", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (ws.root / ".hooks/stop_autonomous_loop.md").exists()
    for n in "ab":
        assert ws.state(n)["status"] == "completed"
        runs = (ws.root / f"side_{n}.log").read_text().split()
        assert sorted(runs, key=int) == [str(i) for i in range(1, STEPS + 1)]  # every step once


def test_resume_one_loop_under_the_global_hook_says_what_to_do_and_changes_nothing(paused: Workspace) -> None:
    ws = paused
    before = (ws.root / ".state/autonomous_loop_a.json").read_bytes()
    r = ws.kiro("loop", "resume", "--task-id", "a")
    assert r.returncode == 1
    assert "kiro loop resume --all" in r.stderr and "Traceback" not in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert (ws.root / ".state/autonomous_loop_a.json").read_bytes() == before
    assert (ws.root / ".hooks/stop_autonomous_loop.md").exists()


def test_resume_all_with_nothing_paused_says_so(ws: Workspace) -> None:
    r = ws.kiro("loop", "resume", "--all")
    assert r.returncode == 0, r.stderr
    assert "no paused loop" in r.stdout


def test_resume_all_refuses_a_task_id(ws: Workspace) -> None:
    r = ws.kiro("loop", "resume", "--all", "--task-id", "a")
    assert r.returncode == 1 and "--all" in r.stderr


def test_resume_all_detached_continues_each_loop_in_the_background(ws: Workspace) -> None:
    _two_paused_loops(ws)
    r = ws.kiro("loop", "resume", "--all", "--detach")
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(r.stdout.split()[-2:]) == ["a", "b"]  # each task id, as `--detach` prints it
    for n in "ab":
        ws.wait_for(lambda n=n: ws.state(n)["status"] == "completed", timeout=120, what=f"loop {n} completed")
