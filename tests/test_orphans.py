"""No process a step started outlives kiro to do the step's work beside a resumed run (issue #7,
item 4). `kill -9` kiro while a shell step's command has a grandchild in the background (or a
child that forked and let its parent exit, without setsid); resume at once: the leftover is
killed before the step runs again, so its delayed side effect never happens.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import FAST_CONFIG, Workspace

TASK = "Specs/feature/tasks.md"

GRANDCHILD = (
    "import os, time; open('gc.pid', 'w').write(str(os.getpid())); time.sleep(60); open('side.log', 'a').write('x')"
)
FORKER = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    open('gc.pid', 'w').write(str(os.getpid())); time.sleep(60); open('side.log', 'a').write('x')\n"
)


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def task_with(command: str) -> str:
    return (
        "---\ntitle: Orphans\nexecutor: shell\n---\n"
        "- [ ] 1. Start something in the background\n"
        "  ```sh\n"
        f"  if [ -e started ]; then echo second run; else touch started; echo $$ > step.pid; {command} sleep 60; fi\n"
        "  ```\n"
    )


@pytest.mark.parametrize("how", ["background", "fork-without-setsid", "setsid", "setsid-without-the-mark"])
def test_kill_9_then_resume_leaves_no_grandchild_to_run_the_step_again(ws: Workspace, how: str) -> None:
    py = sys.executable
    if how == "background":
        command = f'{py} -c "{GRANDCHILD}" &'
    elif how == "setsid":
        command = f'setsid {py} -c "{GRANDCHILD}" &'
    elif how == "setsid-without-the-mark":  # left the group and cleared the reaper's mark: the ledger finds it
        command = f'env -u KIRO_REAPER setsid {py} -c "{GRANDCHILD}" &'
    else:
        (ws.root / "forker.py").write_text(FORKER)
        command = f"{py} forker.py;"
    ws.task(task_with(command))
    # sandbox: off: this is the reaper and ledger that end a step's leftovers where no box does (sandbox: off,
    # or no bwrap); the pids the step records would be those of the box's PID namespace. The box's own end
    # of everything a step started: tests/test_sandbox.py
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: off\n")
    proc = ws.spawn("loop", "start", "--task", TASK)
    ws.wait_for(lambda: (ws.root / "gc.pid").read_text().strip(), what="the grandchild")
    ws.wait_for(lambda: (ws.root / "step.pid").read_text().strip(), what="the step's shell")
    grandchild = int((ws.root / "gc.pid").read_text())
    step_shell = int((ws.root / "step.pid").read_text())
    tid = ws.only_task_id()
    ledger = ws.root / ".state" / "processes" / f"{tid}.json"
    assert ledger.exists() and str(os.getpgid(step_shell)) in ledger.read_text()

    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)
    # The step's shell dies with kiro, and with it its whole process group (the reaper's SIGKILL), and
    # what left the group but still carries kiro's mark in its environment.
    ws.wait_for(lambda: not alive(step_shell), timeout=10, what="the step's shell to die with kiro")
    if how == "setsid-without-the-mark":
        assert alive(grandchild)  # only the ledger's token finds it now
    else:
        ws.wait_for(lambda: not alive(grandchild), timeout=10, what="the grandchild to die with kiro")

    r = ws.kiro("loop", "resume", "--task-id", tid)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not alive(grandchild)  # gone long before its delayed effect (60 s after it started): it never writes
    if how == "setsid-without-the-mark":
        assert any("left behind" in e.get("message", "") for e in ws.events(tid))
    assert not (ws.root / "side.log").exists()
    assert not ledger.exists()  # the resumed run's groups all ended


def test_a_step_that_exits_leaves_no_group_in_the_ledger(ws: Workspace) -> None:
    ws.task("---\ntitle: T\nexecutor: shell\n---\n- [ ] 1. Quick\n  ```sh\n  echo hi\n  ```\n")
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    assert list((ws.root / ".state" / "processes").glob("*.json")) == []


def test_the_ledger_kills_only_processes_that_carry_its_token(tmp_path: Path) -> None:
    """A recorded group id may since belong to someone else: without kiro's token in its
    environment a process is left alone."""
    import json
    import subprocess

    from kiro.processes.groups import TOKEN_VAR, Ledger

    stranger = subprocess.Popen(["sleep", "30"], start_new_session=True)
    ours = subprocess.Popen(["sleep", "30"], start_new_session=True, env={**os.environ, TOKEN_VAR: "t0ken"})
    try:
        for proc in (stranger, ours):  # until exec: a forked child's environment is still the parent's
            deadline = time.monotonic() + 10
            while not Path(f"/proc/{proc.pid}/cmdline").read_bytes().startswith(b"sleep"):
                assert time.monotonic() < deadline, "sleep did not start"
                time.sleep(0.01)
        path = tmp_path / "ledger.json"
        path.write_text(json.dumps({"groups": [{"pgid": stranger.pid, "token": "t0ken"},
                                               {"pgid": ours.pid, "token": "t0ken"}]}))
        killed = Ledger(path).reap()
        assert killed == [ours.pid]
        assert ours.wait(timeout=10) == -signal.SIGKILL
        assert stranger.poll() is None
        assert not path.exists()
    finally:
        stranger.kill()
        ours.kill()
        stranger.wait()
        ours.wait()


def test_without_setpriv_steps_run_but_run_command_is_refused_as_root(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from kiro.processes import groups
    from kiro.processes.spawn import run_process
    from tests.fake_openai import invoke, make_harness

    monkeypatch.setattr(groups, "setpriv_path", lambda: None)
    result = asyncio.run(run_process(["sh", "-c", "echo ran"], cwd=tmp_path))
    assert result.ok and "ran" in result.output
    h = make_harness(tmp_path / "ws", tools={"shell": {"enabled": True, "allow": ["echo"]}})

    async def go() -> str:
        return (await invoke(h.tool_env(), "run_command", {"command": "echo hi"})).text

    text = asyncio.run(go())
    if os.geteuid() == 0:
        assert "setpriv" in text and "unavailable" in text
    else:
        assert "hi" in text


# A kiro whose child takes the reaper's mark only after kiro has died, as a child that kiro's death
# caught between fork and exec does (until exec its environment reads as kiro's, and it has already let
# go of the pipe that tells the reaper kiro is gone). The child waits for kiro's end on a pipe of its
# own, then execs into a process that carries the mark.
LATE_EXEC = """
import os, subprocess, sys
from kiro.processes import groups
name, mark = groups.start_reaper()
r, w = os.pipe()
env = {"PATH": os.environ["PATH"]}
child = subprocess.Popen(["sh", "-c", f"read x; sleep 0.05; exec env {name}={mark} sleep 30"],
                         stdin=r, env=env, start_new_session=True)
print(child.pid, flush=True)
sys.stdin.read()  # the test's cue to end (and with it w, the child's cue to exec)
"""


def test_a_child_that_takes_the_mark_just_after_kiro_died_is_still_killed() -> None:
    import contextlib
    import subprocess

    with subprocess.Popen([sys.executable, "-c", LATE_EXEC], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          text=True) as kiro:
        assert kiro.stdout is not None
        child = int(kiro.stdout.readline())
        try:
            kiro.kill()
            kiro.wait(timeout=10)
            deadline = time.monotonic() + 10
            while alive(child):  # the reaper looks again 0.1 s and 0.5 s after its first look
                assert time.monotonic() < deadline, "the child that took kiro's mark after its death outlived it"
                time.sleep(0.02)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child, signal.SIGKILL)
