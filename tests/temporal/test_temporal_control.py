"""Stop and resume on the temporal backend, through hook files and commands (SPEC §3, §6; docs/scale-out.md
§6): the same statuses, exit codes and state fields as a local loop."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import Workspace, shell_task
from tests.temporal.conftest import Project, Workers

# Step 4's first attempt sleeps a minute (the test stops it with --force); every other step is quick.
STEP = """\
echo "$KIRO_STEP_ID" >> "$RUNS/runs.log"
echo "step $KIRO_STEP_ID" >> work.txt
if [ "$KIRO_STEP_ID" = 4 ] && [ ! -e "$RUNS/slept" ]; then touch "$RUNS/slept"; sleep 61.25; fi
sleep 0.3
"""


def sleeping() -> bool:
    """Is the long step's `sleep 61.25` running anywhere on this machine?"""
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "cmdline").read_bytes() == b"sleep\x0061.25\x00":
                return True
        except OSError:
            continue
    return False


def task_text(n: int) -> str:
    return shell_task(n, cmd=STEP, title="Control task")


def test_stop_and_resume_by_hook_file_and_commands(tws: Workspace, project: Project, workers: Workers,
                                                   tmp_path: Path) -> None:
    rdir = tmp_path / "runs"  # made by the tws fixture, which grants it to the step box
    workers.env = {"RUNS": str(rdir)}
    workers.start_workspace()
    workers.start("w1")
    tws.task(task_text(6))

    def state() -> dict:  # type: ignore[type-arg]
        return tws.state("hs")

    # 1. A hook file dropped by hand: the loop pauses at its next safe point; the foreground start exits 3.
    proc = tws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "hs")
    tws.wait_for(lambda: len(state()["completed_steps"]) >= 1, 60, "step 1")
    tws.write(".hooks/stop_autonomous_loop_hs.md", "---\ntype: stop_hook\n---\nby hand\n")
    assert proc.wait(60) == 3, tws.output(proc)
    st = state()
    assert (st["status"], st["stop_reason"], st["stop_conditions"]["stop_hook_triggered"]) == ("paused", "stop_hook",
                                                                                                True)
    r = tws.kiro("loop", "status", "--task-id", "hs", "--json")
    assert '"status": "paused"' in r.stdout, r.stdout
    paused_at = len(st["completed_steps"])
    time.sleep(1.5)
    assert len(state()["completed_steps"]) == paused_at  # nothing runs while paused

    # 2. `kiro loop resume --detach`: the hook goes, the workflow is signalled, the loop continues.
    r = tws.kiro("loop", "resume", "--task-id", "hs", "--detach")
    assert r.returncode == 0 and r.stdout.strip().endswith("hs"), (r.stdout, r.stderr)
    assert not (tws.root / ".hooks/stop_autonomous_loop_hs.md").exists()
    tws.wait_for(lambda: (rdir / "slept").exists(), 60, "step 4's long first attempt")

    # 3. `kiro loop stop --force` during that step: stopped at once (not after the minute), state saved, exit 3
    #    for the foreground resume that follows it.
    tws.wait_for(sleeping, 30, "the step's long sleep on the worker")
    r = tws.kiro("loop", "stop", "--task-id", "hs", "--force")
    assert r.returncode == 0, (r.stdout, r.stderr)
    tws.wait_for(lambda: state()["status"] == "stopped", 40, "stopped")  # before the minute is up
    assert not sleeping(), "the worker killed the step's processes"
    st = state()
    assert st["stop_reason"] == "signal" and [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3"]
    assert st["current_step"]["step_id"] == "4" and st["current_step"]["status"] == "interrupted"
    assert "- [-] 4." not in (tws.root / "Specs/feature/tasks.md").read_text()  # kiro took its box back

    # 4. `kiro loop stop` (the command) on a stopped loop writes the hook; `resume` in the foreground removes it,
    #    continues the same workflow and exits with the loop's code.
    r = tws.kiro("loop", "stop", "--task-id", "hs")
    assert r.returncode == 0 and (tws.root / ".hooks/stop_autonomous_loop_hs.md").exists()
    r = tws.kiro("loop", "resume", "--task-id", "hs", timeout=120)
    assert r.returncode == 0, (r.stdout, r.stderr)
    st = state()
    assert st["status"] == "completed" and [c["step_id"] for c in st["completed_steps"]] == list("123456")
    assert st["runs"] == 3  # started, resumed by --detach, resumed in the foreground
    runs = (rdir / "runs.log").read_text().split()
    assert runs == ["1", "2", "3", "4", "4", "5", "6"], runs  # step 4 twice: the attempt stopped by --force
    assert project.branch_file("hs", "work.txt") == "".join(f"step {i}\n" for i in range(1, 7))
    events = [e["event"] for e in tws.events("hs")]
    assert events.count("loop_started") == 1 and events.count("loop_resumed") == 2
    assert "step_interrupted" in events
