"""Two `kiro worker` processes, each with its own git clone; five loops; one worker SIGKILLed in the middle of
a step (docs/scale-out.md §9, §13). Every loop completes, no completed step runs again, and the workspace's
state files and reports are those of a local run of the same tasks."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import FAST_CONFIG, Workspace, shell_task
from tests.gitutil import git
from tests.temporal.compare import normal, report_text
from tests.temporal.conftest import Project, Workers

# Every execution of a step is logged (task file, step, the clone it ran in) outside the clones; the step's
# work is one line in work.txt, on the loop's branch. Step 2 of f1 waits at a gate so the test can kill its
# worker mid-step.
STEP = """\
echo "$(basename $(dirname "$KIRO_TASK_FILE")) $KIRO_STEP_ID $(pwd)" >> "$RUNS/runs.log"
echo "step $KIRO_STEP_ID" >> work.txt
if [ "$(basename $(dirname "$KIRO_TASK_FILE"))-$KIRO_STEP_ID" = "f1-2" ]; then
  pwd > "$RUNS/marker.tmp" && mv "$RUNS/marker.tmp" "$RUNS/marker"
  while [ ! -e "$RUNS/gate" ]; do sleep 0.05; done
fi
sleep 0.2
"""


def task_text(n: int) -> str:
    return shell_task(n, cmd=STEP, title="Worker task")


def runs(path: Path) -> list[tuple[str, str, str]]:
    out = []
    for line in path.read_text().splitlines():
        task, step, where = line.split(" ", 2)
        out.append((task, step, where))
    return out


def test_five_loops_two_workers_one_sigkilled_mid_step(tws: Workspace, project: Project, workers: Workers,
                                                       tmp_path: Path) -> None:
    rdir = tmp_path / "runs"  # made by the tws fixture, which grants it to the step box
    workers.env = {"RUNS": str(rdir)}
    workers.start_workspace()
    workers.start("w1")
    workers.start("w2")
    names = [f"f{i}" for i in range(1, 6)]
    for name in names:
        tws.task(task_text(4), f"Specs/{name}/tasks.md")
    args = [a for name in names for a in ("--task", f"Specs/{name}/tasks.md")]
    proc = tws.spawn("loop", "start", *args, env=tws.env(RUNS=str(rdir)))
    where = tws.wait_for(lambda: (rdir / "marker").read_text().strip(), 90, "f1's step 2 to start")
    victim = "w1" if "clone_w1" in where else "w2"
    survivor = "w2" if victim == "w1" else "w1"
    workers.kill(victim)  # SIGKILL, the worker's whole process group: its step's shell dies with it
    (rdir / "gate").write_text("open\n")
    assert proc.wait(180) == 0, tws.output(proc)

    ran = runs(rdir / "runs.log")
    again: list[tuple[str, str]] = []

    def diagnose(what: object, lost: object) -> str:
        """What a failure needs to be understood (CI, 2026-11-23: a step of a loop the killed worker was not
        running ran twice on the survivor, and nothing said why): every execution in order, the loop's
        worker_lost events, and what the workers printed (an activity failure is logged there)."""
        outs = "\n".join(f"--- worker {n}:\n{workers.output(n)[-3000:]}" for n in ("w1", "w2", "workspace"))
        return (f"{what}\nvictim {victim}; worker_lost: {lost}\nexecutions in order:\n"
                + "\n".join(" ".join(r) for r in ran) + f"\n{outs}\n--- kiro:\n{tws.output(proc)[-3000:]}")

    for name in names:
        tid = next(p.name[len("autonomous_loop_"):-5] for p in (tws.root / ".state" / "archive").glob("*.json")
                   if json.loads(p.read_text())["task_path"] == f"Done/{name}/tasks.md")
        st = tws.state(tid)
        failed = [e for e in tws.events(tid) if e["event"] in ("step_failed", "worker_lost")]
        assert st["status"] == "completed" and st["total_successes"] == 4 and st["total_failures"] == 0, \
            diagnose((name, {k: st[k] for k in ("status", "total_successes", "total_failures")}), failed)
        assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3", "4"]
        # the work: exactly one line per step on the loop's branch, one commit per step
        assert project.branch_file(tid, "work.txt") == "".join(f"step {i}\n" for i in range(1, 5))
        assert [c["checkpoint"] for c in st["completed_steps"]] == project.branch_shas(tid)
        # No completed step ran again: a step ran twice only when the killed worker was running it (its first
        # execution there, the second on the survivor); a worker_lost event says so.
        lost = {e["step_id"]: e for e in tws.events(tid) if e["event"] == "worker_lost"}
        for step in "1234":
            execs = [w for t, s, w in ran if (t, s) == (name, step)]
            if len(execs) == 2:
                again.append((name, step))
                assert f"clone_{victim}" in execs[0] and f"clone_{survivor}" in execs[1], diagnose(execs, lost)
                assert lost[step]["tries"] == 2 and lost[step]["worker"] == survivor, diagnose(execs, lost)
            else:
                assert len(execs) == 1, diagnose((name, step, execs), lost)
        if name == "f1":
            f1 = tid
    print(f"{len(ran)} step executions for 20 steps; killed {victim} mid-step; ran again (lost mid-step): {again}")
    assert ("f1", "2") in again
    assert {("clone_w1" in w) for _t, _s, w in ran} == {True, False}, "both workers ran steps"

    # The same task run by the local backend: the same state file, report and events (the kill aside)
    local = Workspace(tmp_path / "local")
    git(tmp_path, "clone", "-q", str(project.remote), str(local.root))
    lruns = tmp_path / "lruns"
    lruns.mkdir()
    local.write("config/autonomous_loop.yaml", FAST_CONFIG + "isolation: worktree\n"  # work on kiro/<id>, as there
                f"sandbox_paths:\n  rw: [{lruns}]\n")
    local.task(task_text(4), "Specs/f1/tasks.md")
    (lruns / "gate").write_text("open\n")
    r = local.kiro("loop", "start", "--task", "Specs/f1/tasks.md", "--task-id", "local1",
                   env=local.env(RUNS=str(lruns)))
    assert r.returncode == 0, r.stderr
    ids = {f1: "<id>", "local1": "<id>"}
    remote_state, local_state = normal(tws.state(f1), ids), normal(local.state("local1"), ids)
    # receipts (SPEC §14, kiro.core.evidence): one per step on both backends, each naming its step's commit (and
    # its times, which differ); the rest of the state is the same
    for st_ in (local_state, remote_state):
        for c in st_["completed_steps"]:
            assert c["receipt"] is not None and c["receipt"]["checkpoint"] == c["checkpoint"], c
            assert c["receipt"]["diff_stat"].endswith("1 file changed, 1 insertion(+)"), c
            c["receipt"] = None
    assert remote_state == local_state, json.dumps([(k, remote_state[k], local_state.get(k)) for k in remote_state
                                                    if remote_state[k] != local_state.get(k)])
    rep = report_text((tws.root / f"Logs/completion_reports/{f1}.md").read_text(), ids)
    lrep = report_text((local.root / "Logs/completion_reports/local1.md").read_text(), ids)
    assert "\n## Receipts\n" in lrep and "\n## Receipts\n" in rep  # their times differ
    rep, lrep = (re.sub(r"\n## Receipts\n.*? in full\.\n", "", text, flags=re.S) for text in (rep, lrep))
    here = f"worktree `{local.root}/.kiro/worktrees/<id>`"
    assert rep == lrep.replace(here, "made by kiro workers, fetched from the remote")
    # the events, but for where the work tree is (here; on the workers there) and the lost worker
    skip = {"worker_lost", "worktree_created", "branch_left"}
    names_remote = [e["event"] for e in tws.events(f1) if e["event"] not in skip]
    # the local first start also keeps kiro's folders out of git (.git/info/exclude, said once as a warning);
    # the temporal backend's start does not do that yet (README "Not done yet")
    names_local = [e["event"] for e in local.events("local1") if e["event"] not in skip
                   and "info/exclude" not in str(e.get("message", ""))]
    assert names_remote == names_local
    assert (tws.root / "Done/f1/tasks.md").read_text().replace(f1, "<id>") == \
        (local.root / "Done/f1/tasks.md").read_text().replace("local1", "<id>")
    assert git(local.root, "show", "kiro/local1:work.txt") == project.branch_file(f1, "work.txt")
    assert git(tws.root, "show", f"kiro/{f1}:work.txt") == project.branch_file(f1, "work.txt")  # fetched
