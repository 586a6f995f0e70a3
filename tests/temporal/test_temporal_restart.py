"""The Temporal server restarted while loops run (docs/scale-out.md §9): nothing is lost. Every loop completes,
every step's work is on its branch once, the state files are complete."""

from __future__ import annotations

import json
from pathlib import Path

from tests.conftest import Workspace, shell_task
from tests.temporal.conftest import Project, TemporalServer, Workers

STEP = """\
echo "$(basename $(dirname "$KIRO_TASK_FILE")) $KIRO_STEP_ID" >> "$RUNS/runs.log"
echo "step $KIRO_STEP_ID" >> work.txt
if [ "$KIRO_STEP_ID" = 2 ]; then touch "$RUNS/$(basename $(dirname "$KIRO_TASK_FILE")).in2"; sleep 2; fi
sleep 0.2
"""


def task_text(n: int) -> str:
    return shell_task(n, cmd=STEP, title="Restart task")


def test_server_restart_mid_run_loses_nothing(tws: Workspace, project: Project, workers: Workers,
                                              temporal_server: TemporalServer, tmp_path: Path) -> None:
    rdir = tmp_path / "runs"  # made by the tws fixture, which grants it to the step box
    workers.env = {"RUNS": str(rdir)}
    workers.start_workspace()
    workers.start("w1")
    workers.start("w2")
    names = [f"r{i}" for i in range(1, 4)]
    for name in names:
        tws.task(task_text(4), f"Specs/{name}/tasks.md")
    args = [a for name in names for a in ("--task", f"Specs/{name}/tasks.md")]
    proc = tws.spawn("loop", "start", *args)
    tws.wait_for(lambda: all((rdir / f"{n}.in2").exists() for n in names), 90, "every loop in its step 2")
    temporal_server.restart()  # SIGTERM, then the same port and database file
    assert proc.wait(180) == 0, tws.output(proc)

    executions = [tuple(line.split()) for line in (rdir / "runs.log").read_text().splitlines()]
    print(f"server restarted during step 2 of {len(names)} loops; {len(executions)} step executions for "
          f"{4 * len(names)} steps")
    for name in names:
        path = next(p for p in (tws.root / ".state" / "archive").glob("*.json")
                    if json.loads(p.read_text())["task_path"] == f"Done/{name}/tasks.md")
        st = json.loads(path.read_text())
        tid = st["task_id"]
        assert st["status"] == "completed" and st["total_failures"] == 0
        assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3", "4"]
        assert project.branch_file(tid, "work.txt") == "".join(f"step {i}\n" for i in range(1, 5))
        assert [c["checkpoint"] for c in st["completed_steps"]] == project.branch_shas(tid)
        for step in "1234":  # the restart cost time, not a step: each ran once
            assert executions.count((name, step)) == 1, (name, step, executions)
        seqs = [e["event"] for e in tws.events(tid)]
        assert seqs.count("step_completed") == 4 and seqs.count("loop_finished") == 1
