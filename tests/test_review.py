"""Review by a second agent (SPEC §14 `review:`): a stand-in step agent (an `executor_command` script) does the
steps of a Kiro spec in a real git project, real bash verify, and a `review: {command: ...}` script reviews each
step from the prompt on its stdin. The reviewer's rule is the one a person would give it: a function without a
docstring is not done ("REVIEW: CHANGES add a docstring to ..."). The agent adds the docstring only when its
prompt says so, or never, or ignores the reviewer once, as `plan.json` says; the reviewer answers by its rule,
or always CHANGES, or garbage, as `reviewer.json` says.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from kiro.store.config import Config
from tests.agent_clis import CODEX_PRICE, Claude, Codex, task_text
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import HttpError, Recorded
from tests.fakes import anthropic as fa
from tests.fakes import responses as fr
from tests.gitutil import git, init_repo

SPEC = ".kiro/specs/calc"
# Run against the previous main (whose config refuses `review`), the cheat test runs the same night without it:
# the agent's unreviewed work goes through, which is what its printed line shows there.
REVIEW_KNOWN = "review" in Config.model_fields

AGENT = '''\
import json, os, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
prompt = sys.stdin.read()
step = os.environ["KIRO_STEP_ID"]
n = len(list(out.glob(f"agent-{step}-*.txt"))) + 1
(out / f"agent-{step}-{n}.txt").write_text(prompt)
plan = json.loads((out / "plan.json").read_text())
action = plan.get(f"{step}:{n}", plan.get("default", "listen"))
(out / f"cwd-{step}-{n}.txt").write_text(os.getcwd())
if plan.get("together") and n == 1:  # side by side: its first run waits until that many steps run at once
    import time
    (out / f"at-{step}").touch()
    for _ in range(4800):
        if len(list(out.glob("at-*"))) >= int(plan["together"]):
            break
        time.sleep(0.05)
    else:
        sys.exit(9)
if action == "hang" and (out / "ready").exists():
    action = "listen"  # it cheats once; its run after the kill listens
name = "f" + step.replace(".", "_")
app = pathlib.Path(f"part{step.replace('.', '_')}.py" if plan.get("own_files") else "app.py")  # (side by side)
text = app.read_text() if app.exists() else ""
(out / f"found-{step}-{n}.txt").write_text(text)  # what it started from
text = re.sub(r"\\ndef " + name + r"\\(\\):\\n(    .*\\n)*", "\\n", text)  # its earlier version of the function
body = "return (" if action == "break" else f"return {step!r}"  # break: a syntax error, so verify fails
text = text.rstrip("\\n") + f"\\n\\n\\ndef {name}():\\n    {body}\\n"
if action == "tidy" or (action == "listen" and "add a docstring" in prompt):  # every function without one gets one
    text = re.sub(r"^def (f\\w+)\\(\\):\\n(?!    \\"\\"\\")", lambda m: m[0] + f'    """{m[1]}."""\\n', text,
                  flags=re.M)
app.write_text(text)
task = pathlib.Path(os.environ["KIRO_TASK_FILE"])
if action == "hang":  # unboxed, the person's task file itself: the box checked there, then kiro is killed
    task = pathlib.Path(os.environ["KIRO_WORKSPACE"]) / ".kiro" / "specs" / "calc" / "tasks.md"
task.write_text(re.sub(r"^(- \\[)[ -](\\] " + re.escape(step) + r"\\. )", r"\\g<1>x\\g<2>", task.read_text(),
                       count=1, flags=re.M))
if action == "hang":
    (out / "ready").write_text("checked")
    import time
    time.sleep(600)
'''

REVIEWER = '''\
import json, pathlib, re, sys
out = pathlib.Path(sys.argv[1])
prompt = sys.stdin.read()
n = len(list(out.glob("review-*.txt"))) + 1
(out / f"review-{n}.txt").write_text(prompt)
said = json.loads((out / "reviewer.json").read_text())
mode = said["mode"]
if said.get("wait_for"):  # first, the loop's event log must hold this (side by side: another step's attempt ended)
    import os, time
    log = pathlib.Path(os.environ["KIRO_WORKSPACE"]) / "Logs" / "rv.jsonl"
    for _ in range(4800):
        if log.exists() and said["wait_for"] in log.read_text():
            break
        time.sleep(0.05)
print("I read the step, its diff and verify's output.")
if mode == "garbage":
    print("Looks fine to me, I guess.")
elif mode == "changes":
    print("REVIEW: CHANGES the function still needs work")
elif mode == "approve":
    print("REVIEW: APPROVE")
elif mode == "vandal":  # it changes what it should only read, and says what it managed (`vandal-<n>.txt`)
    import os
    root = pathlib.Path(os.environ["KIRO_WORKSPACE"])
    done = []
    for what, act in (("wrote app.py", lambda: (root / "app.py").write_text("# the reviewer was here\\n")),
                      ("deleted .gitignore", lambda: (root / ".gitignore").unlink()),
                      ("created new.txt", lambda: (root / "new.txt").write_text("mine\\n")),
                      ("edited tasks.md", lambda: (root / ".kiro/specs/calc/tasks.md").open("a").write(
                          "- [ ] 9. A step the reviewer slipped in\\n"))):
        try:
            act()
            done.append(what)
        except OSError as exc:
            print(f"could not: {what} ({exc.strerror})")
    (out / f"vandal-{n}.txt").write_text("\\n".join(done))
    print("REVIEW: APPROVE")
else:
    diff = prompt.split("## Its diff", 1)[1].split("## Verify", 1)[0]
    missing = [m.group(1) for m in re.finditer(r'^\\+def (f\\w+)\\(\\):\\n(?!\\+    """)', diff, re.M)]
    if missing:
        print(f"REVIEW: CHANGES add a docstring to {missing[0]}")
    else:
        print("REVIEW: APPROVE")
'''

REQUIREMENTS = """\
# Requirements

### Requirement 1: Functions

#### Acceptance Criteria

1. WHEN a step adds a function THEN it SHALL carry a docstring
2. WHEN the checks run THEN they SHALL pass
"""


def project(ws: Workspace, *, plan: dict[str, str] | None = None, reviewer: str = "rule", max_rounds: int = 2,
            steps: int = 2, when: str = "step", titles: dict[int, str] | None = None, extra: str = "") -> Path:
    """A git project with a Kiro spec of `steps` steps, the stand-in agent and the reviewer; returns the folder
    where both leave what they were given."""
    root = ws.root
    init_repo(root)
    (root / "app.py").write_text('"""The app."""\n')
    (root / ".gitignore").write_text("__pycache__/\n")
    out = root.parent / "out"
    out.mkdir()
    (out / "plan.json").write_text(json.dumps(plan or {}))
    (out / "reviewer.json").write_text(json.dumps({"mode": reviewer}))
    (root.parent / "agent.py").write_text(AGENT)
    (root.parent / "reviewer.py").write_text(REVIEWER)
    py = shlex.quote(sys.executable)
    agent = f"{py} {shlex.quote(str(root.parent / 'agent.py'))} {shlex.quote(str(out))}"
    review = f"{py} {shlex.quote(str(root.parent / 'reviewer.py'))} {shlex.quote(str(out))}"
    config = FAST_CONFIG + textwrap.dedent(f"""\
        executor: command
        executor_command: {json.dumps(agent)}
        sandbox_paths: {{rw: [{json.dumps(str(out))}]}}
        verify: {py} -c "import app; print('checks passed')"
        """)
    if REVIEW_KNOWN:
        config += f"review:\n  command: {json.dumps(review)}\n  max_rounds: {max_rounds}\n  when: {when}\n"
    config += extra
    ws.write("config/autonomous_loop.yaml", config)
    (root / SPEC).mkdir(parents=True)
    (root / SPEC / "requirements.md").write_text(REQUIREMENTS)
    lines = ["# Plan", ""]
    for n in range(1, steps + 1):
        title = (titles or {}).get(n, f"Add function f{n}")
        lines += [f"- [ ] {n}. {title}", f"  - return {n!r} from f{n}", "  - _Requirements: 1.1, 1.2_"]
    (root / SPEC / "tasks.md").write_text("\n".join(lines) + "\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "the person's plan")
    return out


def start(ws: Workspace) -> Any:
    return ws.kiro("loop", "start", "--spec", "calc", "--task-id", "rv", timeout=600)


def kinds(ws: Workspace, *names: str) -> list[str]:
    return [e["event"] for e in ws.events("rv") if e["event"] in names]


def receipts(ws: Workspace) -> list[dict[str, Any]]:
    r = ws.run("loop", "receipt", "--task-id", "rv", "--json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    return [entry["receipt"] for entry in (data if isinstance(data, list) else data["receipts"])]


def verdicts(receipt: dict[str, Any]) -> list[str]:
    return [rv["verdict"] for rv in receipt["reviews"]]


def test_an_approved_step_completes_and_its_receipt_says_so(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, reviewer="approve", steps=1)
    r = start(ws)
    assert r.returncode == 0, r.stderr
    assert kinds(ws, "review_started", "review_approved", "review_requested_changes") == \
        ["review_started", "review_approved"]
    [receipt] = receipts(ws)
    assert verdicts(receipt) == ["approve"] and receipt["reviews"][0]["agent"].startswith("command ")
    prompt = (out / "review-1.txt").read_text()
    # the step's text, the requirements it cites quoted from requirements.md, its diff, verify's output
    assert "Add function f1" in prompt and "return 1 from f1" in prompt
    assert "1.1 (Requirement 1: Functions): WHEN a step adds a function THEN it SHALL carry a docstring" in prompt
    assert "+def f1():" in prompt and "checks passed" in prompt
    assert prompt.rstrip().endswith("REVIEW: line.")
    assert "[x] 1. Add function f1" in (ws.root / SPEC / "tasks.md").read_text()
    shown = ws.run("loop", "receipt", "--task-id", "rv", "--step", "1")
    assert "review round 1 by command" in shown.stdout and ": approve" in shown.stdout, shown.stdout


def test_changes_send_the_step_back_with_the_reasons_then_it_is_approved(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, steps=2)
    r = start(ws)
    assert r.returncode == 0, r.stderr
    # each step: the reviewer asked for a docstring, the agent's second prompt said so, the reviewer approved
    for step in ("1", "2"):
        first, second = (out / f"agent-{step}-1.txt").read_text(), (out / f"agent-{step}-2.txt").read_text()
        assert "add a docstring" not in first and "asked for changes" not in first
        assert "asked for changes" in second and f"add a docstring to f{step}" in second
        assert not (out / f"agent-{step}-3.txt").exists()
    assert kinds(ws, "review_approved", "review_requested_changes") == \
        ["review_requested_changes", "review_approved"] * 2
    assert [verdicts(x) for x in receipts(ws)] == [["changes", "approve"]] * 2
    assert [x["reviews"][0]["reasons"] for x in receipts(ws)] == ["add a docstring to f1", "add a docstring to f2"]
    state = ws.state("rv")
    assert state["total_failures"] == 0  # a round of changes is no failure (no backoff, no failure_threshold)
    assert '"""f1."""' in (ws.root / "app.py").read_text()
    log = sorted(p.name for p in (ws.root / "Logs" / "rv").glob("1-review-*.log"))
    assert log == ["1-review-1.log", "1-review-2.log"]


def test_max_rounds_of_changes_pause_the_loop_for_a_person(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, reviewer="changes", max_rounds=2, steps=1)
    r = start(ws)
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert len(list(out.glob("agent-1-*.txt"))) == 2 and len(list(out.glob("review-*.txt"))) == 2
    note = ws.root / "Needs_Action" / "review_changes_rv.md"
    text = note.read_text()
    assert "the function still needs work" in text and "max_rounds 2" in text
    state = ws.state("rv")
    assert state["status"] == "paused" and state["stop_reason"] == "review_changes"
    assert "[ ] 1. Add function f1" in (ws.root / SPEC / "tasks.md").read_text()  # the box is open
    changes = [e for e in ws.events("rv") if e["event"] == "review_requested_changes"]
    assert [e["paused"] for e in changes] == [False, True]


def vandal_night(ws: Workspace, sandbox: str) -> tuple[Any, Path, dict[str, str]]:
    """A step agent that adds f1, then a reviewer that writes app.py, deletes .gitignore, creates new.txt and
    adds a step to the task file; returns the run, the reviewers' folder and the project's files after it."""
    out = project(ws, plan={"default": "listen"}, reviewer="vandal", steps=1, extra=f"sandbox: {sandbox}\n")
    r = start(ws)
    files = {name: (ws.root / name).read_text() for name in ("app.py", ".gitignore", "new.txt", SPEC + "/tasks.md")
             if (ws.root / name).exists()}
    return r, out, files


def test_a_boxed_reviewer_cannot_change_the_project(ws: Workspace) -> None:
    from kiro.processes import sandbox

    if sandbox.unusable() is not None:
        pytest.skip(f"no box here: {sandbox.unusable()}")
    r, out, files = vandal_night(ws, "bwrap")
    managed = (out / "vandal-1.txt").read_text().split("\n") if (out / "vandal-1.txt").is_file() else ["?"]
    print(f"boxed reviewer: tried 4 changes to the project, {4 - len([m for m in managed if m])} held "
          f"(it managed: {[m for m in managed if m] or 'nothing'})")
    assert r.returncode == 0, r.stdout + r.stderr  # its APPROVE counts: it changed nothing
    assert managed == [""]
    assert "def f1():" in files["app.py"] and files[".gitignore"] == "__pycache__/\n" and "new.txt" not in files
    assert "slipped in" not in files[SPEC + "/tasks.md"] and "[x] 1. Add function f1" in files[SPEC + "/tasks.md"]
    [receipt] = receipts(ws)
    assert verdicts(receipt) == ["approve"]


def test_an_unboxed_reviewer_s_changes_are_put_back_and_its_round_fails(ws: Workspace) -> None:
    r, out, files = vandal_night(ws, "off")
    managed = (out / "vandal-1.txt").read_text().split("\n")
    assert managed == ["wrote app.py", "deleted .gitignore", "created new.txt", "edited tasks.md"]  # no box
    # every change put back: the step's own work (f1) stays, the reviewer's is gone
    assert "def f1():" in files["app.py"] and "reviewer was here" not in files["app.py"]
    assert files[".gitignore"] == "__pycache__/\n" and "new.txt" not in files
    assert "slipped in" not in files[SPEC + "/tasks.md"]
    print(f"unboxed reviewer: made {len(managed)} changes, all put back; the loop exited {r.returncode}")
    print("\n".join(line for line in (r.stdout + r.stderr).splitlines() if "reviewer" in line))
    # the round failed (tried once more, the same), so the step is not done: the loop waits for a person
    assert r.returncode == 6, (r.returncode, r.stdout + r.stderr)
    assert "[ ] 1. Add function f1" in files[SPEC + "/tasks.md"]
    note = (ws.root / "Needs_Action" / "review_changes_rv.md").read_text()
    assert "changed the project's files" in note and "changed app.py" in note and "created new.txt" in note


def test_a_box_checked_before_a_kill_is_reviewed_before_it_counts(ws: Workspace) -> None:
    """SPEC §14: a box an agent checked during an attempt kiro never recorded (kiro was killed) counts only once
    it is verified and reviewed on the next run; the reviewer's changes reopen it."""
    out = project(ws, plan={"1:1": "hang", "default": "listen"}, steps=1, extra="sandbox: off\n")
    proc = ws.spawn("loop", "start", "--spec", "calc", "--task-id", "rv")
    try:
        ws.wait_for(lambda: (out / "ready").exists(), timeout=240, what="the agent to check its box")
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    assert "[x] 1. Add function f1" in (ws.root / SPEC / "tasks.md").read_text()  # what the agent left
    r = ws.kiro("loop", "resume", "--task-id", "rv", timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    reopened = [e for e in ws.events("rv") if e["event"] == "step_reopened"]
    assert len(reopened) == 1 and "add a docstring to f1" in reopened[0]["reason"], reopened
    assert "add a docstring to f1" in (out / "agent-1-2.txt").read_text()
    [receipt] = receipts(ws)
    assert verdicts(receipt) == ["changes", "approve"]
    assert '"""f1."""' in (ws.root / "app.py").read_text()


def test_a_task_frontmatter_sets_the_review(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, reviewer="changes", max_rounds=2, steps=1)
    config = (ws.root / "config" / "autonomous_loop.yaml").read_text()
    command = next(line for line in config.splitlines() if line.startswith("  command: "))
    (ws.root / "config" / "autonomous_loop.yaml").write_text(config.split("review:")[0])
    tasks = ws.root / SPEC / "tasks.md"
    tasks.write_text(f"---\nreview:\n{command}\n  max_rounds: 1\n---\n" + tasks.read_text())
    git(ws.root, "commit", "-qam", "review in the frontmatter")
    r = start(ws)
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert len(list(out.glob("review-*.txt"))) == 1  # max_rounds 1, from the frontmatter
    assert "max_rounds 1" in (ws.root / "Needs_Action" / "review_changes_rv.md").read_text()


def test_an_answer_without_a_verdict_is_tried_again_then_the_loop_pauses(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, reviewer="garbage", steps=1)
    r = start(ws)
    assert r.returncode == 6, (r.returncode, r.stderr)
    assert len(list(out.glob("review-*.txt"))) == 2  # tried once more
    assert len(list(out.glob("agent-1-*.txt"))) == 1
    text = (ws.root / "Needs_Action" / "review_changes_rv.md").read_text()
    assert "no answer kiro could read" in text and "invalid" in text
    assert "[ ] 1. Add function f1" in (ws.root / SPEC / "tasks.md").read_text()


def test_a_step_agent_that_ignores_the_reviewer_is_caught(ws: Workspace) -> None:
    # the agent checks its box again without the change the reviewer asked for (its second run); only its
    # third run, which makes the change, counts
    out = project(ws, plan={"1:2": "ignore", "default": "listen"}, max_rounds=3, steps=1)
    r = start(ws)
    assert r.returncode == 0, r.stderr
    [receipt] = receipts(ws)
    rounds = [rv["verdict"] for rv in receipt.get("reviews", [])]
    caught = rounds == ["changes", "changes", "approve"] and '"""f1."""' in (ws.root / "app.py").read_text()
    print(f"cheat: the agent ignores the reviewer once -> {'caught' if caught else 'NOT caught'} (rounds: {rounds})")
    assert caught
    assert len(list(out.glob("agent-1-*.txt"))) == 3
    assert '"""f1."""' in (ws.root / "app.py").read_text()
    assert receipt["attempts"] == 1  # its runs the reviewer sent back are rounds, not attempts


def test_review_rounds_do_not_count_toward_max_step_retries(ws: Workspace) -> None:
    # max_step_retries 1: two attempts. Run 1 is sent back by the reviewer, run 2 fails verify (the step's first
    # failed attempt), run 3 makes the change and is approved: one failed attempt and one that counted
    out = project(ws, plan={"1:2": "break", "default": "listen"}, max_rounds=3, steps=1)
    config = ws.root / "config" / "autonomous_loop.yaml"
    config.write_text(config.read_text().replace("autonomous_loop:\n", "autonomous_loop:\n  max_step_retries: 1\n", 1))
    r = start(ws)
    assert r.returncode == 0, r.stdout + r.stderr
    assert kinds(ws, "step_failed", "review_requested_changes", "review_approved") == \
        ["review_requested_changes", "step_failed", "review_approved"]
    assert len(list(out.glob("agent-1-*.txt"))) == 3
    [receipt] = receipts(ws)
    assert verdicts(receipt) == ["changes", "approve"]
    assert receipt["attempts"] == 2


def test_when_checkpoint_reviews_the_work_since_the_last_checkpoint_at_checkpoint_steps(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, when="checkpoint", steps=3,
                  titles={3: "Checkpoint - Ensure the functions are done"})
    r = start(ws)
    assert r.returncode == 0, r.stderr
    assert {e["step_id"] for e in ws.events("rv") if e["event"] == "review_started"} == {"3"}
    first = (out / "review-1.txt").read_text()
    assert all(f"+def f{n}():" in first for n in (1, 2, 3)) and "the last checkpoint" in first
    assert [verdicts(x) for x in receipts(ws)] == [[], [], ["changes", "approve"]]
    assert "add a docstring to f1" in (out / "agent-3-2.txt").read_text()
    assert (ws.root / "app.py").read_text().count('"""f') == 3


def test_when_task_reviews_the_whole_work_once_before_the_loop_completes(ws: Workspace) -> None:
    out = project(ws, plan={"default": "listen"}, when="task", steps=2)
    r = start(ws)
    assert r.returncode == 0, r.stderr
    assert {e["step_id"] for e in ws.events("rv") if e["event"] == "review_started"} == {"2"}
    first = (out / "review-1.txt").read_text()
    assert "+def f1():" in first and "+def f2():" in first and "the whole task's work" in first
    assert [verdicts(x) for x in receipts(ws)] == [[], ["changes", "approve"]]
    assert (ws.root / "app.py").read_text().count('"""f') == 2


def test_steps_side_by_side_are_each_reviewed_on_their_own_work_and_one_sent_back_keeps_it(ws: Workspace) -> None:
    """`parallel: 2`: steps 1 and 2 run at once, each in its own worktree (their first runs wait for each other).
    Step 1's agent adds a docstring at once, so the reviewer approves it; step 2's does not, so the reviewer asks
    for one: step 2 runs again, its prompt saying why, in a worktree that starts with its first run's work, and
    is approved. Each review reads its own step's diff, and the receipts show the rounds."""
    out = project(ws, plan={"own_files": "yes", "together": "2", "1:1": "tidy", "default": "listen"}, steps=2,
                  titles={1: "(P) Add function f1", 2: "(P) Add function f2"}, extra="parallel: 2\n")
    r = start(ws)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = sorted(p.name for p in out.glob("agent-*.txt"))
    assert runs == ["agent-1-1.txt", "agent-2-1.txt", "agent-2-2.txt"], runs
    for name in ("cwd-1-1", "cwd-2-1", "cwd-2-2"):  # every run in a worktree of its own, beside the other step
        assert "/.kiro/worktrees/rv.step-" in (out / f"{name}.txt").read_text(), name
    # step 2's second run: the reviewer's reasons in its prompt, and its first run's work where it began
    assert "asked for changes" in (out / "agent-2-2.txt").read_text()
    assert "add a docstring to f2" in (out / "agent-2-2.txt").read_text()
    assert "def f2():" in (out / "found-2-2.txt").read_text()
    prompts = {n: (out / f"review-{n}.txt").read_text() for n in (1, 2, 3)}
    by_step: dict[str, list[str]] = {}
    for n in (1, 2, 3):
        step = "1" if "Step 1 of" in prompts[n] else "2"
        by_step.setdefault(step, []).append(prompts[n])
        other = "2" if step == "1" else "1"
        assert f"+def f{step}():" in prompts[n] and f"def f{other}" not in prompts[n]  # the step's own diff
        assert "checks passed" in prompts[n]  # verify's output
    assert [len(by_step["1"]), len(by_step["2"])] == [1, 2]
    assert [(verdicts(x), x["attempts"]) for x in receipts(ws)] == [(["approve"], 1), (["changes", "approve"], 1)]
    assert receipts(ws)[1]["reviews"][0]["reasons"] == "add a docstring to f2"
    assert [e["step_id"] for e in ws.events("rv") if e["event"] == "review_requested_changes"] == ["2"]
    assert kinds(ws, "step_failed") == [] and ws.state("rv")["total_failures"] == 0
    for n in (1, 2):  # the approved work is what was checkpointed, once
        assert (ws.root / f"part{n}.py").read_text().count(f'"""f{n}."""') == 1
    assert git(ws.root, "status", "--porcelain", "--", "part1.py", "part2.py") == ""
    assert "rv.step-" not in git(ws.root, "worktree", "list")


def test_side_by_side_a_pause_for_max_rounds_keeps_the_work_for_the_resumed_run(ws: Workspace) -> None:
    """`parallel: 2`, max_rounds 1: the reviewer sends step 1 back and the loop pauses (exit 6) while step 2's
    attempt has finished beside it. A person lets the reviewer approve and resumes: step 1 runs again from its
    work, step 2's finished attempt is taken up without running again, both are approved."""
    out = project(ws, plan={"own_files": "yes", "together": "2", "default": "listen"}, reviewer="changes",
                  max_rounds=1, steps=2, titles={1: "(P) Add function f1", 2: "(P) Add function f2"},
                  extra="parallel: 2\n")
    (out / "reviewer.json").write_text(json.dumps(  # step 1's review ends once step 2's attempt is done
        {"mode": "changes", "wait_for": '"event": "parallel_step_finished", "step_id": "2", "outcome": "completed"'}))
    r = start(ws)
    assert r.returncode == 6, r.stdout[-3000:] + r.stderr[-3000:]
    assert "the function still needs work" in (ws.root / "Needs_Action" / "review_changes_rv.md").read_text()
    assert sorted((p["step_id"], p["status"]) for p in ws.state("rv")["parallel"]) == [("1", "reopened"), ("2", "done")]
    (out / "reviewer.json").write_text(json.dumps({"mode": "approve"}))
    r = ws.kiro("loop", "resume", "--task-id", "rv", timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert sorted(p.name for p in out.glob("agent-*.txt")) == ["agent-1-1.txt", "agent-1-2.txt", "agent-2-1.txt"]
    assert "the function still needs work" in (out / "agent-1-2.txt").read_text()
    assert "def f1():" in (out / "found-1-2.txt").read_text()  # it began from its first run's work
    assert [verdicts(x) for x in receipts(ws)] == [["changes", "approve"], ["approve"]]
    assert (ws.root / "part2.py").exists() and ws.state("rv")["parallel"] == []
    assert git(ws.root, "status", "--porcelain", "--", "part1.py", "part2.py") == ""


def test_a_review_key_kiro_cannot_honour_is_refused(ws: Workspace) -> None:
    project(ws, steps=1)
    for bad, said in (("review: {agent: codex, command: cat}", "exactly one of agent"),
                      ("review: {command: cat, when: nightly}", "review.when"),
                      ("review: {agent: codex}\nbackend: temporal", "review.agent is not built on the temporal"),
                      ("review: {command: cat, rounds: 3}", "review.rounds")):
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "executor: command\nexecutor_command: cat\n" + bad + "\n")
        r = start(ws)
        assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
        assert said in r.stderr and "Traceback" not in r.stderr


# -- the real CLIs: claude does the steps, codex reviews (scripted servers on 127.0.0.1, tests/fakes) -------


class CodexReviewer(Codex):
    """Codex as the reviewer: its model asks for one change at its first review, then approves."""

    def brain(self, rec: Recorded) -> fr.Reply | HttpError:
        usage = {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}
        assert isinstance(self.server, fr.FakeResponses)
        reviews = [r for r in self.server.calls() if "You are reviewing one step" in fr.user_text(r.body)]
        if len(reviews) == 1:
            said = "NOTES.md says hello but has no title.\nREVIEW: CHANGES give NOTES.md a title line"
        else:
            said = "The notes have their title now.\nREVIEW: APPROVE"
        return fr.Reply([fr.message(said)], **usage)


def test_claude_does_the_steps_and_codex_reviews_them(ws: Workspace, cli_home: Path) -> None:
    claude, codex = Claude(cli_home / "claude"), CodexReviewer(cli_home / "codex")
    for cli in (claude, codex):
        (cli_home / cli.name).mkdir()
        if not cli.installed:
            pytest.skip(cli.skip_reason())
    claude.extra = [("Write", {"file_path": str(ws.root / "NOTES.md"), "content": "hello\n"})]
    claude.start()
    codex.start()
    try:
        init_repo(ws.root)
        ws.task(task_text(2))
        git(ws.root, "add", "-A")
        git(ws.root, "commit", "-q", "-m", "the plan")
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\nreview:\n  agent: codex\n" + CODEX_PRICE)
        env = ws.env(**{**codex.env(), **claude.env()})  # HOME: claude's; codex reads CODEX_HOME
        r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rv", env=env, timeout=600)
        assert r.returncode == 0, r.stdout + r.stderr
        shown = ws.run("loop", "receipt", "--task-id", "rv", env=env)
        print(shown.stdout)
        [first, second] = receipts(ws)
        assert verdicts(first) == ["changes", "approve"] and verdicts(second) == ["approve"]
        assert first["reviews"][0]["reasons"] == "give NOTES.md a title line"
        assert all(rv["agent"] == "codex" and rv["total_tokens"] > 0 for rv in first["reviews"] + second["reviews"])
        assert first["attempts"] == 1 and first["agent"] == "claude"  # its second run was a round's changes
        # claude's second attempt at step 1 was told why
        prompts = [fa.first_user_text(c.body) for c in claude.server.agent_calls()]  # type: ignore[union-attr]
        assert any("give NOTES.md a title line" in p for p in prompts)
        # codex saw the step's diff: the file claude wrote
        asked = [fr.user_text(c.body) for c in codex.server.calls()]  # type: ignore[union-attr]
        assert "+hello" in asked[0] and "NOTES.md" in asked[0]
        assert "review round 1 by codex: changes: give NOTES.md a title line" in shown.stdout
        assert (ws.root / "Logs" / "rv" / "1-review-1.log").is_file()
        state = ws.state("rv")
        spent = sum(rv["total_tokens"] for rv in first["reviews"] + second["reviews"])
        # the loop's usage is the steps' and the reviews'; a receipt's tokens are its step's own
        assert state["usage"]["total_tokens"] == first["total_tokens"] + second["total_tokens"] + spent
        assert first["total_tokens"] == 2 * second["total_tokens"] > 0  # claude's two runs at step 1, one at 2
    finally:
        claude.close()
        codex.close()


def test_a_reviewer_s_usage_limit_is_the_loop_s_sleep_and_its_runs_are_reviews(ws: Workspace, cli_home: Path) -> None:
    from tests.test_usage_limits import Window, code_of, kiro_json

    claude, codex = Claude(cli_home / "claude"), CodexReviewer(cli_home / "codex")
    for cli in (claude, codex):
        (cli_home / cli.name).mkdir()
        if not cli.installed:
            pytest.skip(cli.skip_reason())
    claude.start()
    codex.start()
    window = Window(4, fr.usage_limit)  # codex's first review meets its usage limit, resetting 4 s later
    assert codex.server is not None
    codex.server.brain = window.wrap(codex.server.brain)  # type: ignore[attr-defined]
    try:
        init_repo(ws.root)
        ws.task(task_text(1))
        git(ws.root, "add", "-A")
        git(ws.root, "commit", "-q", "-m", "the plan")
        ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\nreview:\n  agent: codex\n" + CODEX_PRICE)
        env = ws.env(**{**codex.env(), **claude.env()})
        proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rv", env=env)
        try:
            def asleep_or_ended() -> str | None:
                if proc.poll() is not None:
                    return "ended"
                state = ws.state("rv")
                return "sleeping" if state["status"] == "sleeping" else None

            seen = ws.wait_for(asleep_or_ended, timeout=240, what="the loop to sleep on codex's limit")
            status = kiro_json(ws, env, "loop", "status", "--task-id", "rv") if seen == "sleeping" else [{}]
            assert code_of(proc, 300) == 0, ws.output(proc)
        finally:
            if proc.poll() is None:
                proc.kill()
        row = status[0] if isinstance(status, list) else status
        print(f"while codex's review waited for its limit, `kiro loop status` said: {row.get('status')} "
              f"({row.get('sleep_note')})")
        assert row.get("status") == "sleeping" and row["sleep_note"].startswith("codex limit, resumes "), row
        assert window.limited > 0
        ran = [(e["agent"], e["outcome"], e.get("review", False)) for e in ws.events("rv") if e["event"] == "agent_ran"]
        assert ("codex", "usage_limit", True) in ran and all(review == (agent == "codex") for agent, _, review in ran)
        by_agent = kiro_json(ws, env, "loop", "stats")["by_agent"]
        runs = {name: sum(a == name for a, _, _ in ran) for name in ("claude", "codex")}
        assert by_agent["codex"]["runs"] == 0 and by_agent["codex"]["reviews"] == runs["codex"]
        assert by_agent["claude"]["reviews"] == 0 and by_agent["claude"]["runs"] == runs["claude"]
        shown = ws.run("loop", "stats", env=env).stdout
        print(shown[shown.index("By agent"):])
        assert f"{by_agent['codex']['reviews']} reviews" in shown, shown
    finally:
        claude.close()
        codex.close()
