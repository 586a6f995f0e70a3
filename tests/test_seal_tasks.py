"""SPEC §15 through task files: nothing a step writes may widen its own or another loop's powers (issue #39
items 2, 4 and 9's spin), and kiro never undoes a person's edit of the task file made while a step runs
(issue #38 item 1).

Each attack is a real boxed step (bubblewrap), run by a real `kiro loop start`, `resume` or `watch`. What a
step may try: plant a task file (in `Specs/` or `.kiro/specs/`) whose frontmatter turns the box off, rewrite
its own frontmatter (`sandbox: "off"`, a wider `tools.shell.allow`, `agent_env.pass`, a bigger budget) and
add a step, or change another loop's frontmatter. A planted step that runs outside the box writes a canary
file the box cannot reach: a canary is an attack that got through. Each test prints what it tried and how
many held.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from kiro.processes import sandbox
from tests.agent_clis import CLIS, serving, task_text
from tests.conftest import FAST_CONFIG, Workspace
from tests.fakes import anthropic as fa

pytestmark = pytest.mark.skipif(sandbox.unusable() is not None, reason=f"bwrap cannot box here: {sandbox.unusable()}")

TASK = "Specs/feature/tasks.md"


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    """A folder outside the workspace that no box may write (in the box /tmp is its own): a file in it is a
    step that ran unboxed."""
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def boxed(ws: Workspace, extra: str = "") -> None:
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: bwrap\n" + extra)


def unboxed_step(canary: Path, name: str) -> str:
    """A step (markdown) whose command leaves a canary where only an unboxed process can write."""
    return f"- [ ] 1. Innocent looking\n  ```sh\n  touch {canary / name}\n  ```\n"


def planted(canary: Path, name: str) -> str:
    return f'---\ntitle: planted\nexecutor: shell\nsandbox: "off"\n---\n# Plan\n\n{unboxed_step(canary, name)}'


def payload(canary: Path, name: str, text: str) -> str:
    """A file in the project (the box shows it; its /tmp is its own) holding `text`, which a step copies where
    it attacks, as a shell word."""
    folder = canary.parent / "vault" / "payloads"
    folder.mkdir(exist_ok=True)
    path = folder / name
    path.write_text(text)
    return str(path)


def shell_task(*steps: str, frontmatter: str = "") -> str:
    body = "".join(f"- [ ] {i}. Step {i}\n  ```sh\n  {cmd}\n  ```\n" for i, cmd in enumerate(steps, 1))
    return f"---\ntitle: attacker\nexecutor: shell\n{frontmatter}---\n# Plan\n\n{body}"


class Tally:
    def __init__(self, name: str) -> None:
        self.name, self.tried, self.held = name, 0, 0

    def check(self, what: str, ok: bool) -> None:
        self.tried += 1
        self.held += ok
        print(f"  {'held' if ok else 'GOT THROUGH'}: {what}")

    def done(self) -> None:
        print(f"{self.name}: {self.held} of {self.tried} held")
        assert self.held == self.tried, f"{self.tried - self.held} attack(s) got through"


def pending_notes(ws: Workspace) -> list[Path]:
    folder = ws.root / "Pending_Approval"
    return sorted(folder.glob("task_file_*.md")) if folder.is_dir() else []


# -- item 2: a planted task file -------------------------------------------------------------------


def test_a_task_file_planted_by_a_boxed_step_is_never_started_by_watch(ws: Workspace, canary: Path) -> None:
    """`Specs/` is read-only in the box; `.kiro/specs/`, which this project does not have yet, the step can
    make: the file it plants there waits for a person."""
    boxed(ws)
    plant = planted(canary, "specs_ran")
    kiro_plant = planted(canary, "kiro_spec_ran")
    ws.task(shell_task(f"mkdir -p Specs/zz && cp {payload(canary, 'zz', plant)} Specs/zz/tasks.md || true",
                       f"mkdir -p .kiro/specs/x && cp {payload(canary, 'x', kiro_plant)} .kiro/specs/x/tasks.md"))
    proc = ws.spawn("loop", "watch")
    tally = Tally("planted task files under `kiro loop watch`")
    try:
        ws.wait_for(lambda: (ws.root / "Done" / "feature" / "tasks.md").exists(), timeout=180,
                    what="the attacker's loop to finish")
        ws.wait_for(lambda: "not starting .kiro/specs/x/tasks.md" in ws.output(proc)
                    or (canary / "kiro_spec_ran").exists(), timeout=120,
                    what="watch to say it does not start the planted file")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    out = ws.output(proc)
    tally.check("Specs/zz/tasks.md could not be written", not (ws.root / "Specs" / "zz" / "tasks.md").exists())
    tally.check("Specs/zz/tasks.md with sandbox: off ran nothing outside the box", not (canary / "specs_ran").exists())
    tally.check(".kiro/specs/x/tasks.md with sandbox: off ran nothing outside the box",
                not (canary / "kiro_spec_ran").exists())
    named = {n.read_text().split("path: ", 1)[1].split("\n", 1)[0] for n in pending_notes(ws)}
    tally.check(".kiro/specs/x/tasks.md waits in Pending_Approval/", named == {".kiro/specs/x/tasks.md"})
    tally.check("watch said why, once, and did not spin",
                out.count("not starting .kiro/specs/x/tasks.md") == 1 and out.count("loop task_") <= 2)
    tally.done()


def test_a_planted_task_file_runs_only_after_a_person_approves_it(ws: Workspace, canary: Path) -> None:
    boxed(ws)
    src = payload(canary, "zz", planted(canary, "ran"))
    ws.task(shell_task(f"mkdir -p .kiro/specs/zz && cp {src} .kiro/specs/zz/tasks.md"))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    tally = Tally("a planted task file and `kiro loop start`")
    refused = ws.kiro("loop", "start", "--task", ".kiro/specs/zz/tasks.md")
    tally.check("start refuses it, saying how to approve",
                refused.returncode == 1 and "waits for a person's approval" in refused.stderr
                and "to Approved/" in refused.stderr)
    tally.check("nothing ran unboxed", not (canary / "ran").exists())
    tally.done()
    # the person reads it and approves: it runs as they decided (its own frontmatter: unboxed)
    [note] = pending_notes(ws)
    (ws.root / "Approved").mkdir(exist_ok=True)
    note.rename(ws.root / "Approved" / note.name)
    ok = ws.kiro("loop", "start", "--task", ".kiro/specs/zz/tasks.md")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert (canary / "ran").exists()


@pytest.mark.parametrize("box", ["bwrap", "off"])
def test_a_step_cannot_change_another_loops_frontmatter(ws: Workspace, canary: Path, box: str) -> None:
    """Boxed, `Specs/` is read-only to the step; unboxed, the file it changed waits for a person."""
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + f'sandbox: "{box}"\n')
    mine = f"---\ntitle: other\nexecutor: shell\n---\n# Plan\n\n{unboxed_step(canary, 'other_ran')}"
    other = ws.task(mine, "Specs/other/tasks.md")
    widened = planted(canary, "other_ran")
    ws.task(shell_task(f"cat {payload(canary, 'other', widened)} > Specs/other/tasks.md || true"))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    tally = Tally(f"another loop's frontmatter, sandbox {box}")
    if box == "bwrap":
        tally.check("the step could not write it", other.read_text() == mine)
        ws.kiro("loop", "start", "--task", "Specs/other/tasks.md")
    else:
        started = ws.kiro("loop", "start", "--task", "Specs/other/tasks.md")
        tally.check("its start is refused until a person approves", started.returncode == 1
                    and "waits for a person's approval" in started.stderr)
    tally.check("nothing ran unboxed", not (canary / "other_ran").exists())
    tally.done()


# -- item 4: a step rewrites its own frontmatter -------------------------------------------------------------


WIDER = ('---\ntitle: attacker\nexecutor: shell\nsandbox: "off"\nmax_iterations: 100000\n'
         'tools: {shell: {enabled: true, allow: ["*"]}}\nagent_env: {pass: [AWS_SECRET_ACCESS_KEY]}\n---\n')


@pytest.mark.parametrize("how", ["cat >", "sed -i", "mv"])
def test_a_step_cannot_rewrite_its_own_frontmatter_for_the_next_run(ws: Workspace, canary: Path, how: str) -> None:
    boxed(ws)
    task = ws.root / TASK
    new = WIDER + f"# Plan\n\n- [x] 1. Step 1\n- [ ] 2. Added\n  ```sh\n  touch {canary / 'ran'}\n  ```\n"
    src = payload(canary, "wider", new)
    cmd = {"cat >": f"cat {src} > {TASK}",
           "sed -i": f"sed -i 's/^executor: shell$/executor: shell\\nsandbox: \"off\"/' {TASK}; cat {src} >> {TASK}",
           "mv": f"cp {src} new.md && mv new.md {TASK}"}[how]
    ws.task(shell_task(f"{cmd} || true"))
    before = task.read_text()
    r = ws.kiro("loop", "start", "--task", TASK, "--max-iterations", "1")
    tally = Tally(f"own frontmatter rewritten with {how}")
    done = ws.root / "Done" / "feature" / "tasks.md"
    after = (done if done.exists() else task).read_text()
    tally.check("the frontmatter is the person's", after.split("# Plan")[0] == before.split("# Plan")[0])
    tally.check("no step was added", "2. Added" not in after)
    if not done.exists():  # the person's next resume
        ws.kiro("loop", "resume", "--task-id", ws.only_task_id(), "--max-iterations", "5")
    tally.check("nothing ran unboxed, also after a resume", not (canary / "ran").exists())
    tally.done()
    assert r.returncode in (0, 4), r.stdout + r.stderr


def test_an_unboxed_step_gets_its_frontmatter_put_back(ws: Workspace, canary: Path) -> None:
    """With `sandbox: off` the step can write the task file; kiro puts its frontmatter back after the step
    (the person's edits of the body, which a step cannot be told from, are kept)."""
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "sandbox: \"off\"\n")
    ws.task(shell_task(f"sed -i 's/^title: attacker$/title: attacker\\nmax_iterations: 99999/' {TASK}", "true"))
    r = ws.kiro("loop", "start", "--task", TASK)
    assert r.returncode == 0, r.stdout + r.stderr
    text = (ws.root / "Done" / "feature" / "tasks.md").read_text()
    assert "max_iterations" not in text.split("# Plan")[0], text
    warnings = [e["message"] for e in ws.events(ws.only_task_id()) if e["event"] == "warning"]
    assert any("frontmatter changed while step 1 ran unboxed; kiro put it back" in w for w in warnings), warnings


def test_an_agent_cli_cannot_set_its_frontmatter_and_its_added_steps_wait_for_approval(
        ws: Workspace, canary: Path, cli_home: Path) -> None:
    cli = next(serving(CLIS["claude"](cli_home)))
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    ws.task(task_text(1))
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "  failure_threshold: 1\nsandbox: bwrap\nagent: claude\n")
    task = ws.root / TASK
    cli.extra = [("Read", {"file_path": "{task}"}),
                 ("Edit", {"file_path": "{task}", "old_string": "title: Greeting",
                           "new_string": 'title: Greeting\nsandbox: "off"'}),
                 ("Edit", {"file_path": "{task}", "old_string": "of the greeting\n",
                           "new_string": "of the greeting\n- [ ] 2. Added by the agent\n"}),
                 ("Write", {"file_path": str(task), "content": WIDER + "- [ ] 9. Real file\n"})]
    r = ws.kiro("loop", "start", "--task", TASK, env=ws.env(**cli.env()), timeout=240)
    cli.close()
    tally = Tally("claude on its own frontmatter")
    tally.check("its edit of the frontmatter is not taken", "sandbox" not in task.read_text())
    tally.check("its write of the task file itself fails in the box", "9. Real file" not in task.read_text())
    error = ws.state(ws.only_task_id())["steps"]["1"]["last_error"]
    tally.check("the attempt fails, naming it", r.returncode == 5 and "its frontmatter" in error)
    proposal = ws.root / "Pending_Approval" / f"steps_{ws.only_task_id()}_1.md"
    tally.check("its added step waits for approval", "2. Added by the agent" not in task.read_text()
                and proposal.exists() and "- [ ] 2. Added by the agent" in proposal.read_text())
    tally.done()


# -- issue #38 item 1: the person's edit while a step runs -------------------------------------------------


def _edit_by_rename(task: Path) -> None:
    """What an editor's save does: write a new file beside it, rename it over the task file."""
    text = task.read_text().replace("- [ ] 3.", "- [x] 3.") + "- [ ] 4. Fourth\n"
    tmp = task.with_name(".tasks.md.swp")
    tmp.write_text(text)
    os.replace(tmp, task)


def test_a_persons_save_during_a_claude_step_is_kept_and_counts_no_failure(ws: Workspace, cli_home: Path) -> None:
    cli = next(serving(CLIS["claude"](cli_home)))
    if not cli.installed:
        pytest.skip(cli.skip_reason())
    task = ws.task(task_text(3))
    boxed(ws, "agent: claude\n")
    gate, paused = threading.Event(), threading.Event()
    brain = cli.server.brain  # type: ignore[attr-defined]

    def held(rec: Any) -> Any:
        if fa.is_agent_call(rec.body) and len(fa.tool_results(rec.body)) == 1 and not gate.is_set():
            paused.set()  # it has read its copy; its edit waits until the person has saved
            gate.wait(120)
        return brain(rec)

    cli.server.brain = held  # type: ignore[attr-defined]
    proc = ws.spawn("loop", "start", "--task", TASK, env=ws.env(**cli.env()))
    try:
        assert paused.wait(180), ws.output(proc)
        _edit_by_rename(task)
        gate.set()
        proc.wait(300)
    finally:
        gate.set()
        if proc.poll() is None:
            proc.kill()
        cli.close()
    out = ws.output(proc)
    assert proc.returncode == 0, out
    state = ws.state(ws.only_task_id())
    assert state["total_failures"] == 0, out
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2", "4"], out  # 3: the person checked it
    done = (ws.root / "Done" / "feature" / "tasks.md").read_text()
    assert "- [x] 4. Fourth" in done and "- [x] 3." in done, done


def test_a_persons_save_during_a_shell_step_is_kept(ws: Workspace) -> None:
    go = ws.root / "go"  # in the project: the box's /tmp is its own
    boxed(ws)
    task = ws.task(shell_task(f"touch started; while [ ! -e {go} ]; do sleep 0.05; done",
                              "echo 2 >> ran.log", "echo 3 >> ran.log"))
    proc = ws.spawn("loop", "start", "--task", TASK)
    try:
        ws.wait_for(lambda: (ws.root / "started").exists(), timeout=120, what="step 1 to start")
        fourth = "- [ ] 4. Fourth\n  ```sh\n  echo 4 >> ran.log\n  ```\n"
        text = task.read_text().replace("- [ ] 3.", "- [x] 3.") + fourth
        tmp = task.with_name(".tasks.md.swp")
        tmp.write_text(text)
        os.replace(tmp, task)
        go.touch()
        proc.wait(180)
    finally:
        go.touch()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, ws.output(proc)
    assert (ws.root / "ran.log").read_text().split() == ["2", "4"]
    assert ws.state(ws.only_task_id())["total_failures"] == 0
