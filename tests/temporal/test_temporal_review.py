"""Review by a second agent on the temporal backend (SPEC §14 `review:`): the step's worker runs the reviewer in its
clone after verify, before it commits and pushes the step; a CHANGES verdict runs the step's agent again there with
the reasons in its prompt, and the rounds reach the step's receipt on the workspace host. A real Temporal dev server,
a real `kiro worker` with its own clone, real git, a stand-in agent (`executor_command`) and a command reviewer, both
leaving in `runs/` what they were given."""

from __future__ import annotations

import json
import shlex
import sys
from typing import Any

from tests.conftest import Workspace
from tests.temporal.conftest import Project, Workers

# The agent writes s<step>.txt: "fixed" when its prompt carries the reviewer's reasons, "first" otherwise; it checks
# its box (the command executor's "done").
AGENT = '''\
import os, pathlib, re, sys
runs = pathlib.Path(sys.argv[1])
prompt = sys.stdin.read()
step = os.environ["KIRO_STEP_ID"]
n = len(list(runs.glob(f"agent-{step}-*.txt"))) + 1
(runs / f"agent-{step}-{n}.txt").write_text(prompt)
pathlib.Path(f"s{step}.txt").write_text("fixed\\n" if "write fixed into" in prompt else "first\\n")
task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
task.write_text(re.sub(r"^(- \\[)[ -](\\] " + re.escape(step) + r"\\. )", r"\\g<1>x\\g<2>", task.read_text(),
                       count=1, flags=re.M))
'''

# The reviewer approves step 1; step 2 only at its third review (its first two ask for changes), and only when its
# diff shows s2.txt saying "fixed".
REVIEWER = '''\
import pathlib, sys
runs = pathlib.Path(sys.argv[1])
prompt = sys.stdin.read()
n = len(list(runs.glob("review-*.txt"))) + 1
(runs / f"review-{n}.txt").write_text(prompt)
diff = prompt.split("## Its diff", 1)[1].split("## Verify", 1)[0]
print("I read the step and its diff.")
if "Step 2 of" in prompt and (n < 4 or "+fixed" not in diff):
    print("REVIEW: CHANGES write fixed into s2.txt")
else:
    print("REVIEW: APPROVE")
'''


def setup(tws: Workspace, project: Project, workers: Workers) -> Any:
    runs = project.base / "runs"
    (project.base / "agent.py").write_text(AGENT)
    (project.base / "reviewer.py").write_text(REVIEWER)
    py = shlex.quote(sys.executable)
    agent = f"{py} {shlex.quote(str(project.base / 'agent.py'))} {shlex.quote(str(runs))}"
    reviewer = f"{py} {shlex.quote(str(project.base / 'reviewer.py'))} {shlex.quote(str(runs))}"
    cfg = tws.root / "config/autonomous_loop.yaml"
    cfg.write_text(cfg.read_text() + f"executor: command\nexecutor_command: {json.dumps(agent)}\n"
                   f"verify: cat s1.txt\nreview:\n  command: {json.dumps(reviewer)}\n  max_rounds: 2\n")
    tws.task("---\ntitle: Reviewed\n---\n# Plan\n\n- [ ] 1. Write s1.txt\n- [ ] 2. Write s2.txt\n")
    workers.start_workspace()
    workers.start("w1")
    return runs


def receipts(tws: Workspace, task_id: str) -> list[dict[str, Any]]:
    r = tws.kiro("loop", "receipt", "--task-id", task_id, "--json", timeout=60)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    return [entry["receipt"] for entry in (data if isinstance(data, list) else data["receipts"])]


def test_the_worker_reviews_each_step_a_change_runs_it_again_there_and_max_rounds_pause_the_loop(
        tws: Workspace, project: Project, workers: Workers) -> None:
    runs = setup(tws, project, workers)
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rv", timeout=240)
    # 1. step 1 approved and pushed; step 2: CHANGES, its agent again in the same clone with the reasons, CHANGES
    #    again: max_rounds (2) reached, nothing pushed, the loop pauses for a person
    assert r.returncode == 6, (r.stdout[-3000:], r.stderr[-3000:])
    st = tws.state("rv")
    assert st["status"] == "paused" and st["stop_reason"] == "review_changes", st
    note = (tws.root / "Needs_Action" / "review_changes_rv.md").read_text()
    assert "write fixed into s2.txt" in note and "after 2 round(s) (max_rounds 2)" in note, note
    assert sorted(p.name for p in runs.glob("agent-*.txt")) == ["agent-1-1.txt", "agent-2-1.txt", "agent-2-2.txt"]
    second = (runs / "agent-2-2.txt").read_text()
    assert "asked for changes" in second and "write fixed into s2.txt" in second, second
    assert "write fixed into" not in (runs / "agent-2-1.txt").read_text()
    # the reviewer read each step's own diff (from the commit its attempt began from), and verify's output
    assert "+first" in (runs / "review-1.txt").read_text() and "cat s1.txt" in (runs / "review-1.txt").read_text()
    assert "s1.txt" not in (runs / "review-2.txt").read_text().split("## Its diff", 1)[1].split("## Verify")[0]
    assert "+fixed" in (runs / "review-3.txt").read_text()  # the second run's work, in the same clone
    assert project.branch_log("rv") == ["kiro(rv): 1 Write s1.txt"]
    assert "- [ ] 2. Write s2.txt" in (tws.root / "Specs/feature/tasks.md").read_text()

    # 2. `kiro loop resume`: step 2 runs again from the branch, the last reasons in its prompt, and is approved
    r = tws.kiro("loop", "resume", "--task-id", "rv", timeout=240)
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    assert "write fixed into s2.txt" in (runs / "agent-2-3.txt").read_text()
    assert project.branch_log("rv") == ["kiro(rv): 1 Write s1.txt", "kiro(rv): 2 Write s2.txt"]
    assert project.branch_file("rv", "s2.txt") == "fixed\n"
    events = [e for e in tws.events("rv") if e["event"].startswith("review_")]
    assert [(e["event"], e["step_id"], e["round"]) for e in events] == [
        ("review_started", "1", 1), ("review_approved", "1", 1),
        ("review_started", "2", 1), ("review_requested_changes", "2", 1),
        ("review_started", "2", 2), ("review_requested_changes", "2", 2),
        ("review_started", "2", 3), ("review_approved", "2", 3)], events
    st = tws.state("rv")
    assert st["status"] == "completed" and st["total_failures"] == 0

    # 3. the receipts show every round, with the reasons
    shown = receipts(tws, "rv")
    assert [[(v["round"], v["verdict"]) for v in x["reviews"]] for x in shown] == \
        [[(1, "approve")], [(1, "changes"), (2, "changes"), (3, "approve")]], shown
    assert shown[1]["reviews"][0]["reasons"] == "write fixed into s2.txt"
    assert all(v["agent"].startswith("command ") for x in shown for v in x["reviews"])
    text = tws.kiro("loop", "receipt", "--task-id", "rv", "--step", "2", timeout=60)
    assert text.returncode == 0 and "changes: write fixed into s2.txt" in text.stdout, text.stdout + text.stderr
    print(text.stdout)


def test_an_agent_reviewer_is_refused_on_this_backend_in_one_line(tws: Workspace) -> None:
    cfg = tws.root / "config/autonomous_loop.yaml"
    cfg.write_text(cfg.read_text() + "review: {agent: codex}\n")
    tws.task("# Plan\n\n- [ ] 1. Write s1.txt\n")
    r = tws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ra", timeout=120)
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "review.agent is not built on the temporal backend" in r.stderr and "Traceback" not in r.stderr
