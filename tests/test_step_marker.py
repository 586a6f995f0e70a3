"""`.state/running/<task_id>`: while a step of a loop runs, the mark says so and since when (a task file written
after that time is not started by `start`, `watch` or `serve`: kiro.store.approval.check_task_file). The mark is
made as each step begins and goes as it ends (removed once per step, not at each look around it: issue #41).
"""

from __future__ import annotations

from tests.conftest import FAST_CONFIG, Workspace, shell_task

MARKS = ".state/running"


def unboxed(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: off\n")


def test_each_step_runs_marked_and_no_mark_is_left(ws: Workspace) -> None:
    unboxed(ws)
    ws.task(shell_task(3, cmd=f"ls {MARKS} >> seen.log"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 0, r.stdout + r.stderr
    tid = ws.only_task_id()
    assert (ws.root / "seen.log").read_text().split() == [tid] * 3  # each step saw its loop's mark
    assert list((ws.root / MARKS).iterdir()) == []  # and none is left once the loop is done

