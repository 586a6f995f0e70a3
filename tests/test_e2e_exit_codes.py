"""Every exit code of SPEC §6, reached by running `kiro` as a subprocess on a real workspace, with
the file each must leave behind."""

from __future__ import annotations

import os
import signal

from tests.conftest import Workspace, shell_task

SLOW = 'echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.3'


def _start_and_wait_running(ws: Workspace, *args: str) -> tuple[object, str]:
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", *args)
    tid = ws.wait_for(lambda: ws.only_task_id(), what="state file")
    ws.wait_for(lambda: ws.state(tid)["iteration"] >= 1, what="first iteration")
    return proc, tid


def test_exit_0_completed_moves_task_writes_report_and_archives_state(ws: Workspace) -> None:
    ws.task(shell_task(3))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 0, r.stderr
    tid = ws.only_task_id()
    assert not (ws.root / "Specs/feature/tasks.md").exists()
    done = (ws.root / "Done/feature/tasks.md").read_text()
    assert done.count("- [x]") == 3 and "- [ ]" not in done
    assert done == shell_task(3).replace("- [ ]", "- [x]")  # boxes only: the loop's id is in kiro's state
    report = (ws.root / "Logs/completion_reports" / f"{tid}.md").read_text()
    assert report.startswith("---\ntype: completion_report\n") and f"task_id: {tid}" in report
    assert (ws.root / ".state/archive" / f"autonomous_loop_{tid}.json").exists()
    assert not (ws.root / ".state" / f"autonomous_loop_{tid}.json").exists()
    st = ws.state(tid)
    assert st["status"] == "completed" and st["iteration"] == 3 and st["stop_conditions"]["task_in_done"]
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2", "3"]
    dash = (ws.root / "Dashboard.md").read_text()
    assert "## Completed Today (1)" in dash and tid in dash and "✅ COMPLETED" in dash
    # `status` still finds the archived loop
    s = ws.run("loop", "status", "--task-id", tid, "--json")
    assert s.returncode == 0 and '"status": "completed"' in s.stdout


def test_exit_0_when_a_person_moves_the_task_to_done(ws: Workspace) -> None:
    ws.task(shell_task(30, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    (ws.root / "Done/feature").mkdir(parents=True)
    os.replace(ws.root / "Specs/feature/tasks.md", ws.root / "Done/feature/tasks.md")
    assert proc.wait(timeout=30) == 0  # type: ignore[attr-defined]
    st = ws.state(tid)
    assert st["status"] == "completed" and st["stop_reason"] == "task_in_done"
    assert st["task_path"] == "Done/feature/tasks.md"
    assert (ws.root / "Logs/completion_reports" / f"{tid}.md").exists()
    assert st["iteration"] < 30


def test_exit_3_stop_hook_then_resume_finishes_without_rerunning(ws: Workspace) -> None:
    # while `held` is there a step runs until the loop's stop hook appears: a `kiro loop stop` that starts slowly on
    # a busy machine still finds the loop mid-step; once the loop paused, steps take no time
    held = 'echo "$KIRO_STEP_ID" >> side_effects.log; ' \
           'while [ -e held ] && [ ! -e ".hooks/stop_autonomous_loop_$KIRO_TASK_ID.md" ]; do sleep 0.02; done'
    ws.write("held", "")
    ws.task(shell_task(6, cmd=held))
    proc, tid = _start_and_wait_running(ws)
    r = ws.run("loop", "stop", "--task-id", tid, "--reason", "lunch")
    assert r.returncode == 0, r.stderr
    hook = ws.root / ".hooks" / f"stop_autonomous_loop_{tid}.md"
    text = hook.read_text()
    assert text.startswith("---\ntype: stop_hook\n") and "reason: lunch" in text and "## Resume Instructions" in text
    assert proc.wait(timeout=30) == 3  # type: ignore[attr-defined]
    st = ws.state(tid)
    assert st["status"] == "paused" and st["stop_reason"] == "stop_hook"
    assert st["stop_conditions"]["stop_hook_triggered"]
    assert hook.exists()
    done_before = [c["step_id"] for c in st["completed_steps"]]
    assert 0 < len(done_before) < 6
    (ws.root / "held").unlink()

    r = ws.kiro("loop", "resume", "--task-id", tid)
    assert r.returncode == 0, r.stderr
    assert not hook.exists()
    runs = (ws.root / "side_effects.log").read_text().split()
    for sid in done_before:
        assert runs.count(sid) == 1, f"step {sid} ran again after resume"
    assert sorted(set(runs), key=int) == [str(i) for i in range(1, 7)]


def test_exit_3_hook_dropped_by_hand_for_every_loop(ws: Workspace) -> None:
    ws.task(shell_task(20, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    (ws.root / ".hooks/stop_autonomous_loop.md").write_text("stop everything\n")
    assert proc.wait(timeout=30) == 3  # type: ignore[attr-defined]
    assert ws.state(tid)["status"] == "paused"


def test_exit_3_sigterm_stops_now_and_saves_state(ws: Workspace) -> None:
    ws.task(shell_task(5, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 30; echo "$KIRO_STEP_ID" >> waited.log'))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md")
    tid = ws.wait_for(lambda: ws.only_task_id(), what="state")
    ws.wait_for(lambda: (ws.root / "side_effects.log").exists(), what="step started")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 3
    assert not (ws.root / "waited.log").exists()  # the 30 s step was ended, not waited for
    st = ws.state(tid)
    assert st["status"] == "stopped" and st["stop_reason"] == "signal"
    assert st["current_step"]["status"] == "interrupted"


def test_exit_3_force_stop(ws: Workspace) -> None:
    ws.task(shell_task(5, cmd="sleep 30"))
    proc, tid = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md"), None
    tid = ws.wait_for(lambda: ws.only_task_id(), what="state")
    ws.wait_for(lambda: ws.state(tid)["iteration"] >= 1, what="iteration")
    r = ws.run("loop", "stop", "--task-id", tid, "--force")
    assert r.returncode == 0, r.stderr
    assert proc.wait(timeout=20) == 3
    assert ws.state(tid)["status"] == "stopped"


def test_exit_3_task_deleted_is_not_completed(ws: Workspace) -> None:
    ws.task(shell_task(20, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    (ws.root / "Specs/feature/tasks.md").unlink()
    assert proc.wait(timeout=30) == 3  # type: ignore[attr-defined]
    st = ws.state(tid)
    assert st["status"] == "stopped" and st["stop_reason"] == "task_missing"
    assert not (ws.root / "Logs/completion_reports" / f"{tid}.md").exists()


def test_exit_4_max_iterations_writes_intervention_and_resume_raises_cap(ws: Workspace) -> None:
    ws.task(shell_task(5))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--max-iterations", "2")
    assert r.returncode == 4, r.stderr
    tid = ws.only_task_id()
    st = ws.state(tid)
    assert st["status"] == "max_iterations" and st["iteration"] == 2 and st["stop_conditions"]["max_iterations_reached"]
    req = (ws.root / "Needs_Action" / f"intervention_{tid}.md").read_text()
    assert "type: intervention_request" in req and "reason: max_iterations" in req
    # the cap holds: resuming without raising it runs nothing
    r = ws.kiro("loop", "resume", "--task-id", tid)
    assert r.returncode == 4 and ws.state(tid)["iteration"] == 2
    r = ws.kiro("loop", "resume", "--task-id", tid, "--max-iterations", "10")
    assert r.returncode == 0, r.stderr
    assert ws.state(tid)["iteration"] == 5
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2", "3", "4", "5"]


def test_exit_4_timeout(ws: Workspace) -> None:
    ws.task(shell_task(10, cmd=SLOW))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--timeout", "1")
    assert r.returncode == 4, r.stderr
    tid = ws.only_task_id()
    st = ws.state(tid)
    assert st["status"] == "timed_out" and st["timeout_reached"] and st["stop_reason"] == "timeout_seconds"
    assert (ws.root / "Needs_Action" / f"intervention_{tid}.md").exists()


def test_exit_5_failure_threshold_writes_escalation(ws: Workspace) -> None:
    ws.task(shell_task(3, cmd='echo "boom on $KIRO_STEP_ID"; exit 7'))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--failure-threshold", "2")
    assert r.returncode == 5, r.stderr
    tid = ws.only_task_id()
    st = ws.state(tid)
    assert st["status"] == "failed" and st["consecutive_failures"] == 2 and st["iteration"] == 2
    assert st["stop_conditions"]["failure_threshold_exceeded"]
    assert "exit status 7" in st["failed_steps"][-1]["error"] and "boom on 1" in st["failed_steps"][-1]["error"]
    esc = (ws.root / "Needs_Action" / f"escalation_{tid}.md").read_text()
    assert "type: escalation" in esc and "priority: high" in esc and "boom on 1" in esc


def test_exit_5_one_step_exhausts_its_retries(ws: Workspace) -> None:
    ws.task(shell_task(2, cmd="exit 1"))
    ws.write("config/autonomous_loop.yaml", """\
        autonomous_loop:
          failure_threshold: 10
          max_step_retries: 1
          backoff_base_seconds: 0.01
        """)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 5, r.stderr
    st = ws.state(ws.only_task_id())
    assert st["stop_reason"] == "max_step_retries" and st["iteration"] == 2
    assert st["steps"]["1"]["attempts"] == 2


def test_exit_6_task_moved_to_needs_action_then_resume(ws: Workspace) -> None:
    ws.task(shell_task(10, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    (ws.root / "Needs_Action/feature").mkdir(parents=True)
    os.replace(ws.root / "Specs/feature/tasks.md", ws.root / "Needs_Action/feature/tasks.md")
    assert proc.wait(timeout=30) == 6  # type: ignore[attr-defined]
    st = ws.state(tid)
    assert st["status"] == "paused" and st["stop_reason"] == "needs_action"
    assert st["stop_conditions"]["manual_intervention"]
    assert st["task_path"] == "Needs_Action/feature/tasks.md"
    r = ws.kiro("loop", "resume", "--task-id", tid)
    assert r.returncode == 0, r.stderr
    assert (ws.root / "Done/feature/tasks.md").exists()


def test_exit_6_task_moved_flat_into_needs_action_is_found_by_its_id(ws: Workspace) -> None:
    ws.task(shell_task(10, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    os.replace(ws.root / "Specs/feature/tasks.md", ws.root / "Needs_Action/please_look.md")
    assert proc.wait(timeout=30) == 6  # type: ignore[attr-defined]
    assert ws.state(tid)["task_path"] == "Needs_Action/please_look.md"


def test_exit_1_second_start_names_the_running_pid(ws: Workspace) -> None:
    ws.task(shell_task(20, cmd=SLOW))
    proc, tid = _start_and_wait_running(ws)
    try:
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
        assert r.returncode == 1
        assert f"process {proc.pid}" in r.stderr and "Traceback" not in r.stderr  # type: ignore[attr-defined]
        r = ws.kiro("loop", "resume", "--task-id", tid)
        assert r.returncode == 1
        assert f"process {proc.pid}" in r.stderr  # type: ignore[attr-defined]
    finally:
        proc.send_signal(signal.SIGTERM)  # type: ignore[attr-defined]
        proc.wait(timeout=30)  # type: ignore[attr-defined]


def test_start_refuses_a_task_with_an_unfinished_loop(ws: Workspace) -> None:
    ws.task(shell_task(5))
    assert ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--max-iterations", "1").returncode == 4
    tid = ws.only_task_id()
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md")
    assert r.returncode == 1
    assert f"kiro loop resume --task-id {tid}" in r.stderr


def test_a_foreground_loop_whose_reader_goes_away_goes_on_and_exits_with_its_own_code(ws: Workspace) -> None:
    """`kiro loop start ... | head -1`: the reader of the output leaves after the first line. The loop does
    not die of it (before, the printer's BrokenPipeError ended it as a crash, its step cut short, and the
    command exited 0): it runs every step without printing and exits with its own exit code, 0 here."""
    import subprocess
    import sys

    ws.task(shell_task(4, cmd='echo "$KIRO_STEP_ID" >> side_effects.log; sleep 0.2'))
    proc = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/feature/tasks.md",
                             "--task-id", "t1"], cwd=ws.root, env=ws.env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    first = proc.stdout.readline()
    assert b"started" in first
    proc.stdout.close()  # the reader goes away while the first step runs
    assert proc.wait(timeout=60) == 0
    err = proc.stderr.read().decode()
    proc.stderr.close()
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    state = ws.state("t1")
    assert (state["status"], state["total_successes"]) == ("completed", 4)
    assert (ws.root / "side_effects.log").read_text().split() == ["1", "2", "3", "4"]


def test_a_foreground_loop_whose_output_is_on_a_full_disk_goes_on_and_says_so_once(ws: Workspace) -> None:
    """`kiro loop start ... > log` on a disk that fills up (here /dev/full): before, the first event's print
    raised ENOSPC and kiro ended with "internal error", the loop left pending. Now one warning on stderr, and
    the loop runs to its own exit code."""
    import subprocess
    import sys

    ws.task(shell_task(3))
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "kiro", "loop", "start", "--task", "Specs/feature/tasks.md",
                            "--task-id", "t1"], cwd=ws.root, env=ws.env(), stdout=full, stderr=subprocess.PIPE,
                           text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("cannot write to standard output (No space left on device)") == 1, r.stderr
    assert "internal error" not in r.stderr and "Traceback" not in r.stderr
    state = ws.state("t1")
    assert (state["status"], state["total_successes"]) == ("completed", 3)
