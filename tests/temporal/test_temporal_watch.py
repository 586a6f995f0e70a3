"""`kiro loop watch` on the temporal backend (SPEC §3): a task file dropped into Specs/ gets a loop; a loop
paused by its hook file continues when the hook is deleted."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.conftest import Workspace, shell_task
from tests.temporal.conftest import Project, Workers

STEP = """\
echo "step $KIRO_STEP_ID" >> work.txt
if [ "$KIRO_STEP_ID" = 2 ]; then while [ ! -e "$RUNS/gate" ]; do sleep 0.05; done; fi
"""


def task_text(n: int) -> str:
    return shell_task(n, cmd=STEP, title="Watched")


def test_watch_starts_new_tasks_and_continues_when_the_hook_goes(tws: Workspace, project: Project,
                                                                workers: Workers, tmp_path: Path) -> None:
    rdir = tmp_path / "runs"  # made by the tws fixture, which grants it to the step box
    workers.env = {"RUNS": str(rdir)}
    workers.start_workspace()
    workers.start("w1")
    with open(tmp_path / "watch.out", "w") as out:
        watcher = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "watch"], cwd=tws.root,
                                   env=tws.env(RUNS=str(rdir)), stdout=out, stderr=subprocess.STDOUT,
                                   start_new_session=True)
    try:
        tws.task(task_text(3), "Specs/w/tasks.md")  # dropped in while watch runs
        tid = tws.wait_for(lambda: tws.only_task_id(), 60, "a loop for the new task")
        tws.wait_for(lambda: (tws.state(tid)["current_step"] or {}).get("step_id") == "2", 60, "step 2 running")
        tws.write(f".hooks/stop_autonomous_loop_{tid}.md", "---\ntype: stop_hook\n---\nby hand\n")
        (rdir / "gate").write_text("open\n")
        tws.wait_for(lambda: tws.state(tid)["status"] == "paused", 60, "paused by the hook")
        assert [c["step_id"] for c in tws.state(tid)["completed_steps"]] == ["1", "2"]
        (tws.root / f".hooks/stop_autonomous_loop_{tid}.md").unlink()  # the seed's "Resume Instructions"
        tws.wait_for(lambda: tws.state(tid)["status"] == "completed", 60, "completed after the hook went")
        assert project.branch_file(tid, "work.txt") == "step 1\nstep 2\nstep 3\n"
        assert (tws.root / "Done/w/tasks.md").exists()
        events = [e["event"] for e in tws.events(tid)]
        assert events.count("loop_started") == 1 and events.count("loop_resumed") == 1
    finally:
        os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(30)
    assert watcher.returncode == 0, (tmp_path / "watch.out").read_text()


def test_watch_runs_kiro_specs_in_place_once_and_a_start_keeps_kiros_folders_out_of_git(
        tws: Workspace, project: Project, workers: Workers, tmp_path: Path) -> None:
    """The temporal watch looks at the files the local watch looks at (kiro.core.supervisor.task_files):
    `.kiro/specs/*/tasks.md` too, run in place, each real file once (a second name for a spec folder makes
    no second loop), a finished spec never. The first loop made writes the `.git/info/exclude` block a local
    start writes (kiro.git.ignore), though the workspace worker made `.state/` before it."""
    specs = tws.root / ".kiro/specs"
    (specs / "open").mkdir(parents=True)
    plan = ("- [ ] 1. Build\n  ```sh\n  echo built >> work.txt\n  ```\n"
            "- [ ] 2. Ship\n  ```sh\n  echo shipped >> work.txt\n  ```\n")
    (specs / "open/tasks.md").write_text(plan)
    (specs / "open-again").symlink_to("open")
    finished = "- [x] 1. Done already\n- [ ]* 2. Optional, never run\n"
    (specs / "done").mkdir()
    (specs / "done/tasks.md").write_text(finished)
    tws.write("config/autonomous_loop.yaml", (tws.root / "config/autonomous_loop.yaml").read_text()
              + "executor: shell\n")
    workers.start_workspace()
    workers.start("w1")
    exclude = tws.root / ".git/info/exclude"
    assert (tws.root / ".state").is_dir() and "# >>> kiro" not in exclude.read_text()
    with open(tmp_path / "watch.out", "w") as out:
        watcher = subprocess.Popen([sys.executable, "-m", "kiro", "loop", "watch"], cwd=tws.root, env=tws.env(),
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        tid = tws.wait_for(lambda: tws.only_task_id(), 60, "a loop for the open spec")
        tws.wait_for(lambda: tws.state(tid)["status"] == "completed", 90, "the spec completed")
        (specs / "later").mkdir()  # the watch's next look at every name: then a new spec runs
        (specs / "later/tasks.md").write_text(plan.replace("work.txt", "later.txt"))
        tws.wait_for(lambda: (specs / "later/tasks.md").read_text().count("[x]") == 2, 90, "the later spec")
    finally:
        os.killpg(watcher.pid, signal.SIGTERM)
        watcher.wait(30)
    said = (tmp_path / "watch.out").read_text()
    ids = {p.name[len("autonomous_loop_"):-5] for p in (tws.root / ".state").rglob("autonomous_loop_*.json")
           if "backups" not in p.parts}
    paths = sorted(tws.state(i)["task_path"] for i in ids)
    assert paths == [".kiro/specs/later/tasks.md", ".kiro/specs/open/tasks.md"], (paths, said)
    assert said.count(": started for ") == 2, said
    assert (specs / "open/tasks.md").read_text() == plan.replace("[ ]", "[x]")  # in place, boxes only
    assert (specs / "done/tasks.md").read_text() == finished
    assert project.branch_file(tid, "work.txt") == "built\nshipped\n"
    text = exclude.read_text()
    assert text.count("# >>> kiro") == 1 and "/.state/" in text and "/Logs/" in text, text
    assert "kept kiro's own folders out of git commits" in said, said
