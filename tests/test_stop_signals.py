"""What stops a loop run in the foreground, with a real `kiro loop start` process and real signals (issue #38
items 6 and 17): closing the terminal (SIGHUP) stops it as SIGTERM does, its state saved, its `[-]` box put
back, exit 3; a person who presses Ctrl-C again and again while it stops still gets exit 3, not 130."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from tests.conftest import Workspace

TASK = "Specs/feature/tasks.md"
LONG_STEP = """\
---
title: Long
executor: shell
---
# Plan

- [ ] 1. Wait a long time
  ```sh
  touch step_started; sleep 600
  ```
- [ ] 2. Then this
  ```sh
  echo two
  ```
"""


def started_loop(ws: Workspace) -> subprocess.Popen[str]:
    """`kiro loop start` in its own session (as under a terminal), once its first step runs."""
    ws.task(LONG_STEP)
    proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", TASK], cwd=ws.root, env=ws.env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    ws.wait_for(lambda: (ws.root / "step_started").exists() or proc.poll() is not None, timeout=120,
                what="the step to start")
    assert proc.poll() is None, proc.communicate()[0]
    return proc


def stopped_cleanly(ws: Workspace, rc: int, out: str, signame: str) -> None:
    assert rc == 3, (rc, out)
    tid = ws.only_task_id()
    state = ws.state(tid)
    assert state["status"] == "stopped" and state["stop_reason"] == "signal", state["status"]
    assert f"stopped by {signame}" in out, out
    assert "[-]" not in (ws.root / TASK).read_text(), "the step's box is put back"
    assert ws.events(tid)[-1]["event"] == "loop_finished"


def test_closing_the_terminal_stops_a_foreground_loop_as_sigterm_does(ws: Workspace) -> None:
    proc = started_loop(ws)
    proc.send_signal(signal.SIGHUP)
    out, _ = proc.communicate(timeout=120)
    stopped_cleanly(ws, proc.returncode, out, "SIGHUP")


def test_ctrl_c_pressed_again_and_again_while_the_loop_stops_still_exits_3(ws: Workspace) -> None:
    """Ctrl-C reaches every process of the terminal's group: here each 20 ms until kiro has exited, as a
    person keeps pressing it while the loop winds down."""
    proc = started_loop(ws)
    presses = 0
    while proc.poll() is None:
        try:
            proc.send_signal(signal.SIGINT)
        except ProcessLookupError:
            break
        presses += 1
        time.sleep(0.02)
    out, _ = proc.communicate(timeout=120)
    print(f"Ctrl-C pressed {presses} times")
    stopped_cleanly(ws, proc.returncode, out, "SIGINT")
    history = ws.run("loop", "history")
    assert "step 1 interrupted" in history.stdout and "attempt None" not in history.stdout, history.stdout
