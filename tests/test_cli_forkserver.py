"""The fork server (tests/cli_forkserver.py) runs `kiro` as `python -m kiro` runs it: the same exit
code, stdout and stderr, the caller's cwd, environment and stdin, a timeout that kills it, and a pid
that signals reach. Every `ws.kiro` and `ws.spawn` of the suite goes through it, so a difference here
would be a difference in every test."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest

from tests import cli_forkserver
from tests.conftest import Workspace, shell_task

COMMAND_LINES = [
    ("--version",), ("--help",), ("loop", "status"), ("loop", "status", "--json"), ("loop", "bogus"),
    ("loop", "start", "--task", "Specs/nope/tasks.md"), ("loop", "start", "--task", "Specs/feature/tasks.md",
                                                          "--max-iterations", "zero"),
    ("loop", "logs", "--task-id", "t1", "--json"), ("loop", "state", "--task-id", "missing"),
]


def test_a_forked_kiro_says_and_exits_as_a_cold_one(ws: Workspace) -> None:
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "t1").returncode == 0
    same = 0
    for args in COMMAND_LINES:
        forked = cli_forkserver.run(args, cwd=ws.root, env=ws.env(), timeout=120)
        cold = subprocess.run([sys.executable, "-m", "kiro", *args], cwd=ws.root, env=ws.env(), capture_output=True,
                              text=True, timeout=120)
        assert (forked.returncode, forked.stdout, forked.stderr) == (cold.returncode, cold.stdout, cold.stderr), args
        same += 1
    print(f"{same} of {len(COMMAND_LINES)} command lines: the same exit code, stdout and stderr forked and cold")


def test_the_child_has_the_callers_cwd_environment_and_stdin(ws: Workspace) -> None:
    ws.task(shell_task(1, cmd='echo "$PWD $KIRO_TEST_WORD" > where.txt'))
    r = cli_forkserver.run(["loop", "start", "--task", "Specs/feature/tasks.md"], cwd=ws.root,
                           env=ws.env(KIRO_TEST_WORD="hello"), timeout=120, input="ignored\n" * 50_000)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "where.txt").read_text().split() == [str(ws.root), "hello"]


def test_a_timeout_kills_the_child_and_raises_as_subprocess_does(ws: Workspace) -> None:
    ws.task(shell_task(1, cmd="sleep 60"))
    with pytest.raises(subprocess.TimeoutExpired):
        cli_forkserver.run(["loop", "start", "--task", "Specs/feature/tasks.md"], cwd=ws.root, env=ws.env(),
                           timeout=3)


def test_a_signal_reaches_the_spawned_kiro(ws: Workspace) -> None:
    ws.task(shell_task(50, cmd="sleep 0.5"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md")
    tid = ws.wait_for(lambda: ws.only_task_id(), what="the loop's state")
    ws.wait_for(lambda: ws.state(tid)["iteration"] >= 1, what="the first step")
    assert proc.poll() is None
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=60)
    st = ws.state(tid)
    assert (code, st["status"], st["stop_reason"]) == (3, "stopped", "signal"), Workspace.output(proc)
    assert "stopped by SIGTERM" in Workspace.output(proc)
