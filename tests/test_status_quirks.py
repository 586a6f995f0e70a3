"""What `status`, `logs` and the run's own lines say about a loop, as a person reads them after a
night (issue #32 item 8): a stop hook that comes after the last step, the current step and ETA of a
paused loop, the iteration count across Ctrl-C and resume, a warning said once, singulars, events
as words not JSON, and no `.lock` file left per finished loop."""

from __future__ import annotations

import json
import signal
from typing import Any

from tests.conftest import Workspace, shell_task

TASK = "Specs/feature/tasks.md"
HOOK = 'touch "$KIRO_WORKSPACE/.hooks/stop_autonomous_loop_$KIRO_TASK_ID.md"'


def task_of(*commands: str) -> str:
    # a step plays the person who drops the stop hook at that moment: kiro's box keeps .hooks/ read-only
    # to a step, so these run unboxed (sandbox: off)
    lines = ["---", "title: Night", "executor: shell", "sandbox: off", "---", ""]
    for i, cmd in enumerate(commands, 1):
        lines += [f"- [ ] {i}. Step {i}", "  ```sh", f"  {cmd}", "  ```"]
    return "\n".join(lines) + "\n"


def row(ws: Workspace, tid: str) -> dict[str, Any]:
    r = ws.run("loop", "status", "--json")
    assert r.returncode == 0, r.stderr
    return next(x for x in json.loads(r.stdout) if x["task_id"] == tid)


def test_a_stop_hook_that_comes_during_the_last_step_lets_the_loop_complete(ws: Workspace) -> None:
    ws.task(task_of("true", HOOK))  # `kiro loop stop` while the last step runs
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "last")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("last")
    assert (st["status"], st["stop_reason"]) == ("completed", "all_steps_done")
    assert (ws.root / "Done/feature/tasks.md").exists()


def test_a_stop_hook_before_the_last_step_still_pauses_with_no_current_step_or_eta(ws: Workspace) -> None:
    ws.task(task_of("true", HOOK, "true"))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "mid")
    assert r.returncode == 3, r.stdout + r.stderr
    shown = row(ws, "mid")
    assert shown["status"] == "paused" and shown["steps_done"] == 2
    # step 2 is done: it is not "current", and a loop that is not running has no time to finish
    assert (shown["current_step"], shown["eta"]) == (None, None), shown
    table = ws.run("loop", "status").stdout.splitlines()
    cells = table[1].split()
    assert cells[:2] == ["mid", "paused"] and "2 Step 2" not in table[1], table


def test_ctrl_c_and_resume_do_not_count_as_iterations(ws: Workspace) -> None:
    wait = 'touch "started_$KIRO_STEP_ID"; while [ ! -e go ]; do sleep 0.05; done'
    ws.task(task_of(wait, "true"))
    for n, args in enumerate((("start", "--task", TASK, "--task-id", "cc"), ("resume", "--task-id", "cc"))):
        started = ws.root / "started_1"
        started.unlink(missing_ok=True)
        proc = ws.spawn("loop", *args)
        ws.wait_for(started.exists, what=f"step 1 running ({n})")
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 3, ws.output(proc)
        assert ws.state("cc")["iteration"] == 0, ws.output(proc)  # no iteration ran to its end
        assert row(ws, "cc")["current_step"] == "1 Step 1"  # the interrupted step is still the one to do
    (ws.root / "go").touch()
    r = ws.kiro("loop", "resume", "--task-id", "cc")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("cc")["iteration"] == 2  # two steps, two iterations, however often it was stopped
    print("2 Ctrl-C and 2 resumes; iteration 0 after each stop, 2 at the end")


def test_resume_says_it_removed_the_stop_hook_once(ws: Workspace) -> None:
    ws.task(task_of(HOOK, "true"))
    assert ws.kiro("loop", "start", "--task", TASK, "--task-id", "once").returncode == 3
    r = ws.kiro("loop", "resume", "--task-id", "once")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (r.stdout + r.stderr).count("removed the stop hook") == 1, r.stdout + r.stderr
    assert "removed the stop hook" in r.stderr  # the warning stays where scripts look for it


def test_one_step_one_iteration_are_said_in_the_singular(ws: Workspace) -> None:
    ws.task(shell_task(1))
    r = ws.kiro("loop", "start", "--task", TASK, "--task-id", "one")
    assert r.returncode == 0, r.stderr
    for said in (r.stdout, ws.run("loop", "logs", "--task-id", "one").stdout):
        assert "1 steps" not in said and "1 iterations" not in said, said
        assert "after 1 iteration (exit 0)" in said, said
    assert "the one step is done" in r.stdout


def test_logs_read_as_words_not_json(ws: Workspace) -> None:
    ws.task(task_of('touch "started"; while [ ! -e go ]; do sleep 0.05; done', "true"))
    proc = ws.spawn("loop", "start", "--task", TASK, "--task-id", "words")
    ws.wait_for((ws.root / "started").exists, what="step 1 running")
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=60) == 3
    logs = ws.run("loop", "logs", "--task-id", "words").stdout
    assert "{" not in logs and '"step_id"' not in logs, logs
    assert "iteration 1: step 1" in logs and "1 interrupted (stop)" in logs, logs


def test_a_finished_loop_leaves_no_lock_file_in_state(ws: Workspace) -> None:
    ws.task(shell_task(2))
    ws.task(task_of(HOOK, "true"), rel="Specs/other/tasks.md")
    assert ws.kiro("loop", "start", "--task", TASK).returncode == 0  # completed
    assert ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "paused").returncode == 3
    left = sorted(p.name for p in (ws.root / ".state").rglob("autonomous_loop_*.lock"))
    assert left == [], left
