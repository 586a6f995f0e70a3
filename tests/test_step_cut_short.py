"""A step cut short by something that is not the step's fault (issue 7 item 9): the task moved to
Done/ or Needs_Action/ by a person mid-step, the loop's run-time limit, `stop --force`. None of them
records a failure, and none leaves kiro's in-progress marker `[-]` in the task file. Requests a loop
left in Needs_Action/ move to Logs/resolved/ when it resumes or completes."""

from __future__ import annotations

import os

from tests.conftest import Workspace, shell_task

MARK = 'touch "started_$KIRO_STEP_ID"; '


def _failures(st: dict) -> tuple[int, int, list]:  # type: ignore[type-arg]
    errors = [r.get("last_error") for r in st["steps"].values() if r.get("last_error")]
    return st["consecutive_failures"], len(st["failed_steps"]), errors


def test_task_moved_to_done_mid_step_is_no_failure_and_leaves_no_marker(ws: Workspace) -> None:
    ws.task(shell_task(3, cmd=MARK + "sleep 1; exit 1"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "mv")
    ws.wait_for(lambda: (ws.root / "started_1").exists(), what="step 1 running")
    (ws.root / "Done/feature").mkdir(parents=True)
    os.replace(ws.root / "Specs/feature/tasks.md", ws.root / "Done/feature/tasks.md")
    assert proc.wait(timeout=60) == 0, Workspace.output(proc)
    st = ws.state("mv")
    assert (st["status"], st["stop_reason"]) == ("completed", "task_in_done")
    assert _failures(st) == (0, 0, [])
    assert "[-]" not in (ws.root / "Done/feature/tasks.md").read_text()


def test_a_step_that_succeeds_after_its_task_moved_to_needs_action_counts_and_its_box_is_checked(
        ws: Workspace) -> None:
    ws.task(shell_task(3, cmd=MARK + "sleep 1"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "na")
    ws.wait_for(lambda: (ws.root / "started_1").exists(), what="step 1 running")
    (ws.root / "Needs_Action/feature").mkdir(parents=True)
    os.replace(ws.root / "Specs/feature/tasks.md", ws.root / "Needs_Action/feature/tasks.md")
    assert proc.wait(timeout=60) == 6, Workspace.output(proc)
    st = ws.state("na")
    assert st["status"] == "paused" and _failures(st) == (0, 0, [])
    text = (ws.root / "Needs_Action/feature/tasks.md").read_text()
    assert "- [x] 1." in text and "[-]" not in text


def test_the_run_time_limit_mid_step_is_no_failure_and_leaves_no_marker(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  backoff_base_seconds: 0.01\n  timeout_seconds: 1\n")
    ws.task(shell_task(2, cmd=MARK + "sleep 20"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "to")
    assert r.returncode == 4, r.stdout + r.stderr
    st = ws.state("to")
    assert st["status"] == "timed_out" and _failures(st) == (0, 0, [])
    assert "[-]" not in (ws.root / "Specs/feature/tasks.md").read_text()
    assert ws.state("to")["steps"].get("1", {}).get("attempts", 0) <= 1


def test_stop_force_leaves_no_marker(ws: Workspace) -> None:
    ws.task(shell_task(2, cmd=MARK + "sleep 30"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "sf")
    ws.wait_for(lambda: (ws.root / "started_1").exists(), what="step 1 running")
    assert "- [-] 1." in (ws.root / "Specs/feature/tasks.md").read_text()  # while it runs
    r = ws.run("loop", "stop", "--task-id", "sf", "--force")
    assert r.returncode == 0, r.stderr
    assert proc.wait(timeout=30) == 3
    assert "[-]" not in (ws.root / "Specs/feature/tasks.md").read_text()
    assert _failures(ws.state("sf")) == (0, 0, [])
    # and resume picks the step up again
    (ws.root / "Specs/feature/tasks.md").write_text(shell_task(2, cmd="true").replace(
        "executor: shell", "executor: shell\nkiro_task_id: sf"))
    r = ws.kiro("loop", "resume", "--task-id", "sf")
    assert r.returncode == 0, r.stdout + r.stderr


def test_an_escalation_moves_to_logs_resolved_when_the_loop_resumes(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", "autonomous_loop:\n  backoff_base_seconds: 0.01\n"
                                            "  failure_threshold: 2\n  max_step_retries: 5\n")
    ws.task(shell_task(1, cmd="test -e fixed"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "esc")
    assert r.returncode == 5
    assert (ws.root / "Needs_Action/escalation_esc.md").exists()
    (ws.root / "fixed").touch()
    r = ws.kiro("loop", "resume", "--task-id", "esc", "--reset-failures")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not [p.name for p in (ws.root / "Needs_Action").iterdir() if "esc" in p.name]
    [archived] = (ws.root / "Logs/resolved").glob("escalation_esc*.md")
    assert "type: " in archived.read_text()
    assert "Logs/resolved" in r.stderr + r.stdout  # the person is told where it went


def test_an_intervention_request_moves_to_logs_resolved_when_the_loop_completes(ws: Workspace) -> None:
    ws.task(shell_task(3, cmd="true"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "mi", "--max-iterations", "1")
    assert r.returncode == 4
    assert (ws.root / "Needs_Action/intervention_mi.md").exists()
    r = ws.kiro("loop", "resume", "--task-id", "mi", "--max-iterations", "10")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (ws.root / "Needs_Action/intervention_mi.md").exists()
    assert list((ws.root / "Logs/resolved").glob("intervention_mi*.md"))


def test_stop_force_that_must_kill_still_takes_the_marker_back(ws: Workspace) -> None:
    """A loop process that will not stop on SIGTERM is killed after 10 s; `stop --force` then takes
    its `[-]` back itself. (The holder stands in for a hung kiro: it holds the loop's lock and ignores
    SIGTERM, after a real run of the loop was killed mid-step.)"""
    import signal
    import subprocess
    import sys

    ws.task(shell_task(2, cmd=MARK + "sleep 60"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "hk")
    ws.wait_for(lambda: (ws.root / "started_1").exists(), what="step 1 running")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert "- [-] 1." in (ws.root / "Specs/feature/tasks.md").read_text()
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import pathlib, signal, sys, time\nfrom kiro.store.statestore import StateStore\n"
         "from kiro.store.workspace import Workspace\n"
         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
         "lock = StateStore(Workspace(pathlib.Path(sys.argv[1]))).acquire('hk')\n"
         "print('held', flush=True)\ntime.sleep(120)\n", str(ws.root)],
        stdout=subprocess.PIPE, text=True, env=ws.env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        r = ws.run("loop", "stop", "--task-id", "hk", "--force")  # inherent: its 10 s for SIGTERM pass first
        assert r.returncode == 0, r.stderr
        assert "was killed" in r.stderr
    finally:
        holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
    assert "[-]" not in (ws.root / "Specs/feature/tasks.md").read_text()
