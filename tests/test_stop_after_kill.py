"""`kiro loop stop --force` in the moments after a loop's kiro process was killed (`kill -9`).

The kernel's lock table names the process that TOOK a flock, not the ones holding it now: a child that
inherited the lock's open file (a step's process caught between its fork and its exec) keeps the lock
after kiro is gone, the table still naming kiro's pid, which any new process may get. `stop --force`
signals only a process that holds the loop's lock: never the process that now has the dead kiro's pid.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import Workspace, shell_task

STEP = 'echo $$ > "step_pid_$KIRO_STEP_ID"; sleep 60'

# Takes the loop's lock as kiro does, forks a child that keeps the locked descriptor (as a step's process
# forked by kiro does until its exec), then becomes another program (exec): the lock table names its pid,
# and the process with that pid is no longer the loop's. That program ignores SIGTERM and notes it.
HOLDER = """
import os, pathlib, sys, time
from kiro.store.statestore import StateStore
from kiro.store.workspace import Workspace
lock = StateStore(Workspace(pathlib.Path(sys.argv[1]))).acquire(sys.argv[2])
child = os.fork()
if child == 0:
    time.sleep(120)
    os._exit(0)
print(child, flush=True)
os.execv(sys.executable, [sys.executable, '-c', sys.argv[3], sys.argv[4]])
"""
UNRELATED = """
import signal, sys, time
signal.signal(signal.SIGTERM, lambda *_: open(sys.argv[1], 'a').write('SIGTERM\\n'))
print('unrelated', flush=True)
time.sleep(120)
"""


def _running(pid: int) -> bool:
    """Process `pid` is there and not a zombie (an orphan's parent here may be slow to reap it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _kill_mid_step(ws: Workspace, tid: str) -> int:
    """A loop whose step sleeps, its kiro process killed with SIGKILL mid-step: the pid of the step's shell."""
    # sandbox: off: the pid the step writes is one of this machine's (in a box it is the box's own), and its
    # end with kiro is the reaper's (a box's: tests/test_sandbox.py)
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    ws.task(shell_task(2, cmd=STEP))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", tid)
    step_pid = int(ws.wait_for(lambda: (ws.root / "step_pid_1").read_text().strip(), what="step 1 running"))
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return step_pid


def test_stop_force_after_a_kill_ends_the_loops_process_that_holds_the_lock_and_no_other(
        ws: Workspace, tmp_path: Path) -> None:
    step_pid = _kill_mid_step(ws, "ko")
    # the step kiro ran does not outlive it (its reaper), and the killed loop could not take its `[-]` back
    ws.wait_for(lambda: not _running(step_pid), timeout=30, what="the killed loop's step to end")
    assert "- [-] 1." in (ws.root / "Specs/feature/tasks.md").read_text()
    noted = tmp_path / "signals.txt"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(ws.root), "ko", UNRELATED, str(noted)],
                              stdout=subprocess.PIPE, text=True, env=ws.env())
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        assert holder.stdout.readline().strip() == "unrelated"
        r = ws.run("loop", "stop", "--task-id", "ko", "--force")
        assert r.returncode == 0, r.stdout + r.stderr
        out = r.stdout + r.stderr
        assert f"process {holder.pid}, which took its lock, has ended; process {child}, which it started" in out, out
        ws.wait_for(lambda: not _running(child), timeout=10, what="the process holding the lock to end")
        assert holder.poll() is None, "the process that has the dead taker's pid was killed"
        assert not noted.exists(), "the process that has the dead taker's pid was signalled"
    finally:
        holder.kill()
        holder.wait()
        holder.stdout.close()
        if _running(child):
            os.kill(child, signal.SIGKILL)
    assert "[-]" not in (ws.root / "Specs/feature/tasks.md").read_text()  # taken back, as for a loop it kills
    r = ws.run("loop", "status", "--task-id", "ko")
    assert r.returncode == 0 and "interrupted" in r.stdout, r.stdout + r.stderr


def test_stop_force_right_after_a_kill_says_the_loop_had_ended(ws: Workspace) -> None:
    """Nothing is left to stop: `stop --force` says so (not "stopped; state saved", which the loop did not
    do), and the step kiro ran has ended with it."""
    step_pid = _kill_mid_step(ws, "kk")
    r = ws.run("loop", "stop", "--task-id", "kk", "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout + r.stderr
    assert "state saved" not in out and ("not running" in out or "had already ended" in out), out
    ws.wait_for(lambda: not _running(step_pid), timeout=30, what="the killed loop's step to end")


def test_stop_force_of_one_loop_of_a_process_names_its_other_loops_that_stop_too(ws: Workspace) -> None:
    """Loops started together run in one process, and a signal reaches all of them: `stop --force` of one says
    which others stop with it, before they do."""
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    for name in ("a", "b"):
        ws.task(shell_task(1, cmd=f'touch "started_{name}"; sleep 60'), rel=f"Specs/{name}/tasks.md")
    proc = ws.spawn("loop", "start", "--task", "Specs/a/tasks.md", "--task", "Specs/b/tasks.md")
    ws.wait_for(lambda: (ws.root / "started_a").exists() and (ws.root / "started_b").exists(), what="both steps")
    states = (ws.root / ".state").glob("autonomous_loop_*.json")
    ids = {ws.state(tid)["task_path"]: tid for tid in (p.name[len("autonomous_loop_"):-len(".json")] for p in states)}
    a, b = ids["Specs/a/tasks.md"], ids["Specs/b/tasks.md"]
    r = ws.run("loop", "stop", "--task-id", a, "--force")
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"process {proc.pid} also runs loop {b}: those stop too" in r.stderr, r.stdout + r.stderr
    assert proc.wait(timeout=60) == 3
    assert ws.state(b)["status"] == "stopped"
