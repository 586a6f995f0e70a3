"""Background loops (--detach), following a live loop, and on_event notifiers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from tests.conftest import Workspace, shell_task


def test_start_detach_prints_the_task_id_and_the_loop_runs_in_the_background(ws: Workspace) -> None:
    ws.task(shell_task(6, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.2'))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--detach")
    assert r.returncode == 0, r.stderr
    tid = r.stdout.strip().splitlines()[-1]
    assert tid.startswith("task_")
    st = ws.run("loop", "status", "--task-id", tid, "--json")
    assert '"alive": true' in st.stdout or '"status": "completed"' in st.stdout
    ws.wait_for(lambda: ws.state(tid)["status"] == "completed", timeout=60, what="background loop completes")
    assert (ws.root / "side_effects.log").read_text().split() == [str(i) for i in range(1, 7)]
    assert (ws.root / "Logs" / f"{tid}.out").exists()  # its output went to a file


def test_detach_reports_an_error_that_happens_at_once(ws: Workspace) -> None:
    ws.task("no steps here\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--detach")
    assert r.returncode == 1 and "no steps" in r.stderr


def test_resume_detach_and_logs_follow(ws: Workspace) -> None:
    ws.task(shell_task(5, cmd="sleep 0.2"))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "bg",
                   "--max-iterations", "1").returncode == 4
    r = ws.kiro("loop", "resume", "--task-id", "bg", "--max-iterations", "10", "--detach")
    assert r.returncode == 0 and r.stdout.strip().endswith("bg")
    follow = ws.kiro("loop", "logs", "--task-id", "bg", "--follow", timeout=60)
    assert follow.returncode == 0
    assert "completed after 5 iterations" in follow.stdout  # followed to the end of the resumed run
    assert ws.state("bg")["status"] == "completed"


def test_watch_detach_and_sigterm(ws: Workspace) -> None:
    r = ws.kiro("loop", "watch", "--detach")
    assert r.returncode == 0, r.stderr
    pid = int(r.stdout.strip().splitlines()[-1])
    try:
        ws.task(shell_task(2), "Specs/dropped/tasks.md")
        ws.wait_for(lambda: (ws.root / "Done/dropped/tasks.md").exists(), timeout=60, what="watch ran it")
    finally:
        os.kill(pid, signal.SIGTERM)
    ws.wait_for(lambda: not (ws.root / ".state/watch.pid").exists(), timeout=30, what="watch stopped")


def test_on_event_notifiers_get_the_facts_and_a_failing_one_does_not_stop_the_loop(ws: Workspace) -> None:
    ws.task(shell_task(2))
    ws.write("config/autonomous_loop.yaml", """\
        on_event:
          completed: 'echo "$KIRO_EVENT $KIRO_TASK_ID $KIRO_STATUS $KIRO_REASON $KIRO_REPORT" > notified.txt'
          finished: 'echo boom; exit 3'
        """)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "n")
    assert r.returncode == 0, r.stderr
    event, tid, status, reason, report = (ws.root / "notified.txt").read_text().split()
    assert (event, tid, status, reason) == ("completed", "n", "completed", "all_steps_done")
    assert report.endswith("Logs/completion_reports/n.md") and os.path.exists(report)
    failed = [e for e in ws.events("n") if e["event"] == "notifier_failed"]
    assert failed and failed[0]["kind"] == "finished" and "exit status 3" in failed[0]["error"]


def test_limit_notifier_on_max_iterations(ws: Workspace) -> None:
    ws.task(shell_task(3))
    ws.write("config/autonomous_loop.yaml", "on_event:\n  limit: 'echo $KIRO_REASON > limit.txt'\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--max-iterations", "1")
    assert r.returncode == 4
    assert (ws.root / "limit.txt").read_text().strip() == "max_iterations"


def test_status_does_not_import_openai_or_watchfiles(ws: Workspace) -> None:
    ws.task(shell_task(1))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md").returncode == 0
    r = subprocess.run([sys.executable, "-X", "importtime", "-m", "kiro", "loop", "status"], cwd=ws.root,
                       env=ws.env(), capture_output=True, text=True, timeout=60)
    assert r.returncode == 0
    modules = {line.split("|")[-1].strip() for line in r.stderr.splitlines() if "|" in line}
    assert "openai" not in modules and "watchfiles" not in modules


def test_several_tasks_in_one_process(ws: Workspace) -> None:
    ws.task(shell_task(3, cmd='echo "a$KIRO_STEP_ID" >> side_effects.log; sleep 0.1'), "Specs/a/tasks.md")
    ws.task(shell_task(2, cmd='echo "b$KIRO_STEP_ID" >> side_effects.log; sleep 0.1'), "Specs/b/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/a/tasks.md", "--task", "Specs/b/tasks.md")
    assert r.returncode == 0, r.stdout + r.stderr
    ran = (ws.root / "side_effects.log").read_text().split()
    assert sorted(ran) == ["a1", "a2", "a3", "b1", "b2"]
    assert ran.index("b1") < ran.index("a3")  # side by side, not one after the other
    assert (ws.root / "Done/a/tasks.md").exists() and (ws.root / "Done/b/tasks.md").exists()
    pids = {st.get("pid") for st in (ws.state(t) for t in _ids(ws))}
    assert pids == {None}  # both finished; each state recorded its own end


def test_several_tasks_exit_code_is_the_first_that_is_not_0(ws: Workspace) -> None:
    ws.task(shell_task(1), "Specs/a/tasks.md")
    ws.task(shell_task(1, cmd="exit 1"), "Specs/b/tasks.md")
    r = ws.kiro("loop", "start", "--task", "Specs/a/tasks.md", "--task", "Specs/b/tasks.md",
                "--failure-threshold", "1")
    assert r.returncode == 5


def _ids(ws: Workspace) -> list[str]:
    return [p.name[len("autonomous_loop_"):-5] for p in (ws.root / ".state").rglob("autonomous_loop_*.json")
            if "backups" not in p.parts]
