"""Kiro's own files (issue #31 items 1, 2 and 4): a spec folder as Kiro writes it
(`.kiro/specs/<feature>/requirements.md`, `design.md`, `tasks.md`, and `.kiro/steering/*.md`) runs in
place; every step prompt names the spec's documents and the steering Kiro would include, and quotes the
requirements the step cites; the tasks.md stays byte for byte what Kiro wrote plus box characters;
`pause_at_checkpoints` / `pause_every` stop for a person with a review note.

The specs are real ones from the corpus (tests/data/kiro-tasks). The agents are the real Claude Code CLI
against the scripted Anthropic server (tests/agent_clis.py) and kiro's own agent against the scripted
OpenAI server (tests/fake_openai.py); the prompts checked are the ones those servers recorded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.agent_clis import CLIS, Cli, serving
from tests.conftest import FAST_CONFIG, Workspace, openai_config, shell_task
from tests.fake_openai import FakeOpenAI, call
from tests.fakes import anthropic as fa

DATA = Path(__file__).parent / "data" / "kiro-tasks"
EXTRACTOR = "01_myakura_gloriosa_markdown-page-extractor"  # requirements, design, tasks: 8 open steps
MEMBERS = "06_phan-tuan-thanh_mpm_member-management"  # checkpoints 5, 7 and 9 ("Checkpoint — ...", "Final checkpoint")
FEATURE = "markdown-page-extractor"
SPEC = f".kiro/specs/{FEATURE}"
OPEN_STEPS = ["3.1", "3.2", "3.3", "3.4", "3.5", "4", "5", "6"]
STEERING = {
    "product.md": "# Product\nA browser extension.\n",  # no frontmatter: always, as in Kiro
    "js-style.md": '---\ninclusion: fileMatch\nfileMatchPattern: "gloriosa_background.js"\n---\n# JS\nTabs.\n',
    "release.md": "---\ninclusion: manual\n---\n# Releasing\nOnly when asked.\n",
}


def kiro_spec(root: Path, sample: str = EXTRACTOR, feature: str = FEATURE) -> bytes:
    """A Kiro project at `root`: the corpus sample's spec documents and three steering files. The
    tasks.md bytes as Kiro wrote them."""
    folder = root / ".kiro" / "specs" / feature
    folder.mkdir(parents=True)
    for doc in ("requirements", "design", "tasks"):
        src = DATA / f"{sample}_{doc}.md"
        if src.exists():
            shutil.copyfile(src, folder / f"{doc}.md")
    steering = root / ".kiro" / "steering"
    steering.mkdir(parents=True, exist_ok=True)
    for name, text in STEERING.items():
        (steering / name).write_text(text)
    return (folder / "tasks.md").read_bytes()


def only_boxes_changed(before: bytes, after: bytes) -> int:
    """The files differ only in box characters `[ ]` -> `[x]`: how many boxes changed."""
    assert len(before) == len(after), "kiro added or removed bytes in the task file"
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    for i in changed:
        assert (before[i - 1:i + 2], after[i - 1:i + 2]) == (b"[ ]", b"[x]"), (i, before[i - 20:i + 20])
    return len(changed)


def check_prompts(prompts: dict[str, str]) -> None:
    """What each step's prompt (as the agent's server received it) says of the spec."""
    from kiro.store import kirospec

    assert sorted(prompts) == sorted(OPEN_STEPS), sorted(prompts)
    req = kirospec.criteria((DATA / f"{EXTRACTOR}_requirements.md").read_text())
    for step, text in prompts.items():
        assert f"{SPEC}/requirements.md" in text and f"{SPEC}/design.md" in text, (step, text)
        assert ".kiro/steering/product.md" in text, step  # always
        assert ".kiro/steering/release.md" not in text, step  # manual: never
        # fileMatch: only the step that names gloriosa_background.js
        assert (".kiro/steering/js-style.md" in text) == (step == "3.1"), (step, text)
    assert req["3.1"] in prompts["3.1"] and req["8.6"] in prompts["3.1"]  # the cited criteria, quoted
    assert req["2.1"] in prompts["3.3"] and req["5.5"] in prompts["3.3"]
    assert req["3.1"] not in prompts["3.3"]  # not cited there
    print(f"{len(prompts)} step prompts name requirements.md, design.md and the steering Kiro includes; "
          f"e.g. step 3.1 quotes: {req['3.1'][:60]}...")


# -- the real Claude Code CLI ---------------------------------------------------------------------

@pytest.fixture
def claude(cli_home: Path) -> Iterator[Cli]:
    yield from serving(CLIS["claude"](cli_home))


def test_claude_runs_a_real_kiro_spec_in_place(ws: Workspace, claude: Cli) -> None:
    before = kiro_spec(ws.root)
    ws.write("config/autonomous_loop.yaml", FAST_CONFIG + "agent: claude\n")
    r = ws.kiro("loop", "start", "--spec", FEATURE, "--task-id", "cl", env=ws.env(**claude.env()), timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    after = (ws.root / SPEC / "tasks.md").read_bytes()
    assert only_boxes_changed(before, after) == len(OPEN_STEPS) + 1  # and parent 3, checked by kiro
    assert [c["step_id"] for c in ws.state("cl")["completed_steps"]] == OPEN_STEPS
    assert not (ws.root / "Done" / FEATURE).exists()  # ran in place
    assert (ws.root / ".state" / "task_files.json").exists()  # the loop's id lives in kiro's state
    prompts = {}
    for rec in claude.server.agent_calls():  # type: ignore[union-attr]
        text = fa.first_user_text(rec.body)
        step = text.split("# Current step: ", 1)[1].split(" ", 1)[0]
        prompts[step] = text
    check_prompts(prompts)


# -- kiro's own agent -------------------------------------------------------------------------------

def test_kiros_own_agent_runs_a_real_kiro_spec_and_reads_its_documents(ws: Workspace, fake: FakeOpenAI) -> None:
    before = kiro_spec(ws.root)
    openai_config(ws, fake)
    fake.reply(call("read_file", {"path": f"{SPEC}/requirements.md"}))  # the agent may read what it is told of
    for step in OPEN_STEPS:
        fake.reply(call("complete_step", {"summary": f"did {step}"}))
    r = ws.kiro("loop", "start", "--spec", FEATURE, "--task-id", "own")
    assert r.returncode == 0, r.stdout + r.stderr
    assert only_boxes_changed(before, (ws.root / SPEC / "tasks.md").read_bytes()) == len(OPEN_STEPS) + 1
    prompts: dict[str, str] = {}
    read_result = None
    for rec in fake.chat_requests:
        msgs = rec.body["messages"]
        user = next(m["content"] for m in msgs if m["role"] == "user")
        step = user.split("# Current step: ", 1)[1].split(" ", 1)[0]
        prompts.setdefault(step, user)
        read_result = read_result or next((m["content"] for m in msgs if m["role"] == "tool"), None)
    check_prompts(prompts)
    assert read_result is not None and "Acceptance Criteria" in read_result, read_result  # not refused


# -- Kiro's files as they are --------------------------------------------------------------------

def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


def git_project(root: Path) -> None:
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "-c", "user.name=p", "-c", "user.email=p@x", "commit", "-qm", "the spec")


SHELL_SPEC = """\
# Implementation Plan

- [ ] 1. Set up the module
  - Create `src/app.txt`
  - _Requirements: 1.1_
  ```sh
  mkdir -p src && echo one > src/app.txt
  ```

- [ ] 2. Checkpoint - Ensure all tests pass
  ```sh
  test -f src/app.txt
  ```
- [ ]* 3. Write extra tests
  ```sh
  echo never >> never.txt
  ```
"""


def test_checkpoint_commits_carry_the_spec_boxes_and_kiros_folders_stay_out_of_git(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text(SHELL_SPEC)
    git_project(root)
    ws = Workspace(root)
    r = ws.kiro("loop", "start", "--spec", "auth", "--executor", "shell", "--task-id", "g")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "kiro's own folders" in r.stdout + r.stderr and ".git/info/exclude" in r.stdout + r.stderr  # says so
    assert git(root, "status", "--porcelain", "--untracked-files=all") == ""  # boxes committed, kiro's folders ignored
    assert git(root, "log", "-1", "--format=", "--name-only").split() == [".kiro/specs/auth/tasks.md"]
    assert "[x] 1. Set up" in git(root, "show", "HEAD~1:.kiro/specs/auth/tasks.md")
    exclude = (root / ".git/info/exclude").read_text()
    assert exclude.count("# >>> kiro") == 1 and "/.state/" in exclude and "/Logs/" in exclude
    r = ws.run("init", ".")  # says nothing new, writes the block no second time
    assert (root / ".git/info/exclude").read_text() == exclude, r.stdout
    assert "info/exclude" not in r.stdout


def test_a_finished_spec_is_not_started_and_needs_action_and_config_stay_out_of_commits(tmp_path: Path) -> None:
    """Issue #38 item 15: starting a spec whose boxes are all checked made an empty loop record (and kiro's
    folders); `Needs_Action/` and `config/` were not in kiro's block in .git/info/exclude."""
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text("# Implementation Plan\n\n- [x] 1. Done\n- [x] 2. Done too\n")
    git_project(root)
    ws = Workspace(root)
    r = ws.kiro("loop", "start", "--spec", "auth", "--executor", "shell")
    print(r.stdout + r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every step of .kiro/specs/auth/tasks.md is checked already: nothing to start" in r.stdout + r.stderr
    assert sorted(p.name for p in root.iterdir()) == [".git", ".kiro"]  # no loop record, no folder made
    (root / ".kiro/specs/auth/tasks.md").write_text(SHELL_SPEC)
    assert ws.kiro("loop", "start", "--spec", "auth", "--executor", "shell", "--task-id", "n").returncode == 0
    exclude = (root / ".git/info/exclude").read_text()
    assert "/Needs_Action/" in exclude and "/config/" in exclude, exclude
    (root / "Needs_Action").mkdir(exist_ok=True)
    (root / "Needs_Action/review_n.md").write_text("a note for the person\n")
    (root / "config").mkdir(exist_ok=True)
    (root / "config/autonomous_loop.yaml").write_text("autonomous_loop: {}\n")
    assert "Needs_Action" not in git(root, "status", "--porcelain", "--untracked-files=all")
    assert "config/" not in git(root, "status", "--porcelain", "--untracked-files=all")


def test_a_spec_run_in_a_kiro_repository_makes_none_of_kiros_layout_at_its_root(tmp_path: Path) -> None:
    """Issue #38 item 15: `start --spec` in a Kiro repository (no `kiro init`) made `Specs/ Done/ Needs_Action/
    Dashboard.md` at the project's root. Now only kiro's own `.state/` and `Logs/` (kept out of git)."""
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text(SHELL_SPEC)
    git_project(root)
    ws = Workspace(root)
    r = ws.kiro("loop", "start", "--spec", "auth", "--executor", "shell", "--task-id", "k")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "[x] 2. Checkpoint" in (root / ".kiro/specs/auth/tasks.md").read_text()
    status = git(root, "status", "--porcelain", "--untracked-files=all").splitlines()
    print("git status after the run:", status, "; at the root:", sorted(p.name for p in root.iterdir()))
    assert set(status) <= {" M .kiro/specs/auth/tasks.md"}, status  # the boxes (committed by checkpoints)
    made = [name for name in ("Specs", "Done", "Needs_Action", "Dashboard.md", ".hooks") if (root / name).exists()]
    assert made == [], made
    assert (root / ".state").is_dir() and (root / "Logs/k.jsonl").is_file()


def test_kiro_init_in_a_repository_keeps_its_folders_out_and_says_so(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "src").mkdir(parents=True)
    (repo / "src/main.py").write_text("print(1)\n")
    git_project(repo)
    r = Workspace(repo).run("init", "vault")  # a workspace in a subfolder of the project
    assert r.returncode == 0 and "kept kiro's own folders out of git commits" in r.stdout, r.stdout + r.stderr
    (repo / "vault/.state/x.json").write_text("{}")
    (repo / "vault/Logs/a.jsonl").write_text("{}")
    (repo / "vault/Dashboard.md").write_text("# d")
    status = git(repo, "status", "--porcelain", "--untracked-files=all").split("\n")
    assert not [ln for ln in status if ".state" in ln or "Logs" in ln or "Dashboard" in ln], status
    assert not (repo / ".gitignore").exists() and not (repo / "vault/.gitignore").exists()  # no file of theirs


def test_an_unknown_spec_is_one_line_that_lists_the_specs(tmp_path: Path) -> None:
    """(That a refused start creates nothing is shown for every refusal in tests/test_refused_start.py.)"""
    root = tmp_path / "project"
    for name in ("auth", "billing"):
        (root / ".kiro/specs" / name).mkdir(parents=True)
        (root / ".kiro/specs" / name / "tasks.md").write_text("- [ ] 1. A step\n")
    r = Workspace(root).kiro("loop", "start", "--spec", "nope")
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        "kiro: no Kiro spec 'nope' (no .kiro/specs/nope/tasks.md); the specs here: auth, billing"], r.stderr


def test_a_moved_spec_task_file_is_found_by_the_id_kiro_keeps(tmp_path: Path) -> None:
    from kiro.store import taskmap
    from kiro.store.workspace import Workspace as Ws
    from kiro.store.workspace import locate_task

    root = tmp_path / "p"
    spec = root / ".kiro/specs/auth/tasks.md"
    spec.parent.mkdir(parents=True)
    spec.write_text("- [ ] 1. a\n")
    ws = Ws(root)
    ws.ensure_folders()
    taskmap.remember(ws.state_dir, "t1", spec)
    assert taskmap.task_id_for(ws.state_dir, spec) == "t1"
    moved = root / "Needs_Action" / "auth-review.md"  # moved and renamed by a person
    moved.parent.mkdir()  # by the person: a Kiro repository's loop makes no Needs_Action/ (issue #38 item 15)
    spec.rename(moved)
    assert locate_task(ws, spec, "t1") == ("Needs_Action", moved)
    assert taskmap.task_id_for(ws.state_dir, moved) == "t1"


def test_watch_runs_a_spec_once_through_a_symlinked_specs_folder_and_leaves_a_finished_one(tmp_path: Path) -> None:
    root = tmp_path / "project"
    (root / ".kiro/specs/done").mkdir(parents=True)
    finished = "- [x] 1. Done already\n- [ ]* 2. Optional, never run\n"
    (root / ".kiro/specs/done/tasks.md").write_text(finished)
    (root / ".kiro/specs/open").mkdir()
    (root / ".kiro/specs/open/tasks.md").write_text(shell_task(2, cmd='echo "$KIRO_STEP_ID" >> runs.log'))
    (root / "Specs").symlink_to(".kiro/specs")  # the workaround users tried: the same files twice
    ws = Workspace(root)
    proc = ws.spawn("loop", "watch")
    try:
        ws.wait_for(lambda: (root / "runs.log").read_text().split() == ["1", "2"], timeout=60, what="two steps")
        ws.wait_for(lambda: "- [x] 2." in (root / ".kiro/specs/open/tasks.md").read_text(), what="boxes")
        states = ws.wait_for(lambda: [p for p in (root / ".state").rglob("autonomous_loop_*.json")
                                      if "backups" not in p.parts and "archive" in p.parts], what="archived")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    loops = {p.name for p in (root / ".state").rglob("autonomous_loop_*.json") if "backups" not in p.parts}
    assert len(loops) == 1 and states, (loops, ws.output(proc))  # one loop, for the open spec only
    assert (root / "runs.log").read_text().split() == ["1", "2"]  # no step ran twice
    assert (root / ".kiro/specs/done/tasks.md").read_text() == finished  # left alone
    assert (root / ".kiro/specs/open/tasks.md").exists()  # runs in place: not moved to Done/


def test_watch_runs_each_spec_once_through_symlinks_inside_kiro_specs_and_leaves_a_finished_one(
        tmp_path: Path) -> None:
    """Symlinks inside `.kiro/specs`: a second name for a spec folder, a second name for a finished one, and a
    spec folder that is a task folder of Specs/. Each real task file gets one loop; the finished one none. A
    spec added afterwards shows that the watch looked at every name again meanwhile and started nothing more.
    It is added once every box is checked: made while a step of any loop still runs (shared's echo is in
    runs.log before its step ends), it would wait for a person's approval (SPEC §15), and no loop would start."""
    root = tmp_path / "project"
    specs = root / ".kiro/specs"
    (specs / "done").mkdir(parents=True)
    finished = "- [x] 1. Done already\n- [ ]* 2. Optional, never run\n"
    (specs / "done/tasks.md").write_text(finished)
    (specs / "done-again").symlink_to("done")
    (specs / "open").mkdir()
    (specs / "open/tasks.md").write_text(shell_task(2, cmd='echo "open-$KIRO_STEP_ID" >> runs.log'))
    (specs / "open-again").symlink_to("open")
    (root / "Specs/shared").mkdir(parents=True)
    (root / "Specs/shared/tasks.md").write_text(shell_task(1, cmd='echo "shared-$KIRO_STEP_ID" >> runs.log'))
    (specs / "shared").symlink_to("../../Specs/shared")
    ws = Workspace(root)
    proc = ws.spawn("loop", "watch")

    def ran() -> list[str]:
        return sorted((root / "runs.log").read_text().split())

    try:
        ws.wait_for(lambda: ran() == ["open-1", "open-2", "shared-1"], timeout=60, what="three steps")
        ws.wait_for(lambda: "- [x] 2." in (specs / "open/tasks.md").read_text()
                    and "- [x] 1." in (root / "Done/shared/tasks.md").read_text(), what="every box")
        (specs / "later").mkdir()  # the watch's next look at every name: then a new spec runs
        (specs / "later/tasks.md").write_text(shell_task(1, cmd='echo "later-$KIRO_STEP_ID" >> runs.log'))
        try:
            ws.wait_for(lambda: "- [x] 1." in (specs / "later/tasks.md").read_text(), timeout=60,
                        what="the later spec")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the watch said:\n{ws.output(proc)}") from None
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    loops = sorted(json.loads(p.read_text())["task_path"] for p in (root / ".state").rglob("autonomous_loop_*.json")
                   if "backups" not in p.parts)
    print("loops:", loops)
    assert loops == [".kiro/specs/later/tasks.md", ".kiro/specs/open/tasks.md", "Done/shared/tasks.md"], (
        loops, ws.output(proc))
    assert ran() == ["later-1", "open-1", "open-2", "shared-1"]  # no step ran twice
    assert (specs / "done/tasks.md").read_text() == finished  # left alone


def test_the_first_loop_a_watch_makes_keeps_kiros_folders_out_of_git(tmp_path: Path) -> None:
    """The watch makes `.state/` before its first loop: that loop still writes the `.git/info/exclude` block
    a first `kiro loop start` writes (kiro.git.ignore), once."""
    root = tmp_path / "project"
    (root / ".kiro/specs/auth").mkdir(parents=True)
    (root / ".kiro/specs/auth/tasks.md").write_text(SHELL_SPEC)
    git_project(root)
    ws = Workspace(root)
    proc = ws.spawn("loop", "watch")
    try:
        ws.wait_for(lambda: "[x] 2." in (root / ".kiro/specs/auth/tasks.md").read_text(), timeout=60, what="the spec")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    exclude = (root / ".git/info/exclude").read_text()
    assert exclude.count("# >>> kiro") == 1 and "/.state/" in exclude, (exclude, ws.output(proc))
    assert git(root, "status", "--porcelain", "--untracked-files=all") == "", ws.output(proc)


# -- review points ---------------------------------------------------------------------------------

def test_pause_at_checkpoints_stops_after_each_checkpoint_of_a_real_kiro_plan(tmp_path: Path) -> None:
    root = tmp_path / "project"
    before = kiro_spec(root, MEMBERS, "member-management")
    (root / "config").mkdir()
    (root / "config/autonomous_loop.yaml").write_text(
        FAST_CONFIG + "executor: command\ncommand_success: exit_code\nverify: test -f progress.log\n"
        "executor_command: sh -c 'echo $KIRO_STEP_ID >> progress.log'\npause_at_checkpoints: true\n")
    git_project(root)
    ws = Workspace(root)
    r = ws.kiro("loop", "start", "--spec", "member-management", "--task-id", "rv")
    pauses: list[str] = []
    for _ in range(6):
        if r.returncode != 6:
            break
        st = ws.state("rv")
        assert (st["status"], st["stop_reason"]) == ("paused", "checkpoint"), st["status"]
        last = st["completed_steps"][-1]
        pauses.append(last["step_id"])
        note = (root / "Needs_Action/review_rv.md").read_text()
        assert last["description"] in note and "progress.log" in note and "changed" in note  # the diff stat
        assert "`test -f progress.log` passed" in note
        r = ws.kiro("loop", "resume", "--task-id", "rv")
        # issue #38 item 17: the review's normal end is said, never as a warning
        said = [line for line in (r.stdout + r.stderr).splitlines() if "review_rv" in line]
        print("resume said:", said)
        assert said and not [line for line in said if "warning" in line], said
    assert r.returncode == 0, r.stdout + r.stderr
    # "Checkpoint — Verify ...", "Checkpoint — ..."; the last step, "Final checkpoint", completes the task
    assert pauses == ["5", "7"], pauses
    assert ws.state("rv")["status"] == "completed"
    assert not (root / "Needs_Action/review_rv.md").exists()  # answered: moved to Logs/resolved/
    after = (root / ".kiro/specs/member-management/tasks.md").read_bytes()
    print(f"paused after steps {pauses}; {only_boxes_changed(before, after)} boxes checked, nothing else changed")


def test_pause_every_n_steps(ws: Workspace) -> None:
    ws.task(shell_task(5, extra_frontmatter="pause_every: 2"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "pe")
    done = []
    while r.returncode == 6:
        st = ws.state("pe")
        assert st["stop_reason"] == "checkpoint"
        done.append(len(st["completed_steps"]))
        assert "pause_every: 2" in (ws.root / "Needs_Action/review_pe.md").read_text()
        r = ws.kiro("loop", "resume", "--task-id", "pe")
    assert r.returncode == 0 and done == [2, 4], (done, r.stdout + r.stderr)


# -- reading Kiro's files ------------------------------------------------------------------------

def test_steering_inclusion_as_kiro_applies_it(tmp_path: Path) -> None:
    from kiro.store import kirospec

    steer = tmp_path / ".kiro/steering"
    steer.mkdir(parents=True)
    (steer / "a.md").write_text("# no frontmatter\n")
    (steer / "b.md").write_text("---\ninclusion: fileMatch\nfileMatchPattern: ['src/api/**/*.ts', '*.sql']\n---\n")
    (steer / "c.md").write_text("---\ninclusion: manual\n---\n")
    (steer / "d.md").write_text("---\ninclusion: auto\ndescription: When touching payments\n---\n")
    found = {s.path.name: s for s in kirospec.steering(tmp_path)}
    assert [found[f"{n}.md"].inclusion for n in "abcd"] == ["always", "fileMatch", "manual", "auto"]
    assert kirospec.included(found["a.md"], "anything") == ""
    assert kirospec.included(found["b.md"], "Add the route in `src/api/v1/users.ts`") is not None
    assert kirospec.included(found["b.md"], "Write migrations/0001_init.sql") is not None
    assert kirospec.included(found["b.md"], "Update the README") is None
    assert kirospec.included(found["c.md"], "src/api/x.ts") is None
    assert "payments" in (kirospec.included(found["d.md"], "x") or "")


@pytest.mark.parametrize("sample", ["01_myakura_gloriosa_markdown-page-extractor",
                                    "03_mashharuki_car_license-plate-recognition",
                                    "12_caraseli02_MoldovaDirect_admin-order-management"])
def test_every_requirement_a_corpus_plan_cites_is_found(sample: str) -> None:
    from kiro.store import kirospec

    criteria = kirospec.criteria((DATA / f"{sample}_requirements.md").read_text())
    tasks_text = (DATA / f"{sample}_tasks.md").read_text()
    cited = kirospec.cited_ids([ln for ln in tasks_text.splitlines() if "Requirements" in ln])
    missing = [c for c in cited if c not in criteria]
    print(f"{sample}: {len(cited)} cited ids, {len(cited) - len(missing)} found")
    assert cited and not missing, missing


def test_long_or_many_quotes_are_capped(tmp_path: Path) -> None:
    from kiro.store import kirospec

    spec = tmp_path / ".kiro/specs/x"
    spec.mkdir(parents=True)
    items = "\n".join(f"{i}. WHEN {i} THEN " + "words " * (100 if i == 1 else 20) for i in range(1, 40))
    (spec / "requirements.md").write_text(f"### Requirement 1: Big\n\n#### Acceptance Criteria\n\n{items}\n")
    (spec / "tasks.md").write_text("- [ ] 1. x\n")
    ids = ", ".join(f"1.{i}" for i in range(1, 40))
    text = kirospec.context(spec / "tasks.md", "x", [f"- _Requirements: {ids}_"]) or ""
    assert "1.1" in text and "words " * 100 not in text  # too long to quote: named only
    assert len(text) < kirospec.QUOTES_MAX + 1500
    assert "not quoted here" in text


def test_spec_files_on_a_bad_day_never_hang_or_break_a_prompt(tmp_path: Path) -> None:
    from kiro.store import kirospec

    spec = tmp_path / ".kiro/specs/x"
    steer = tmp_path / ".kiro/steering"
    spec.mkdir(parents=True)
    steer.mkdir(parents=True)
    (spec / "tasks.md").write_text("- [ ] 1. x\n")
    tried = {
        "requirements.md is a FIFO": lambda: os.mkfifo(spec / "requirements.md"),
        "design.md is a folder": lambda: (spec / "design.md").mkdir(),
        "a steering FIFO": lambda: os.mkfifo(steer / "fifo.md"),
        "a steering folder named .md": lambda: (steer / "dir.md").mkdir(),
        "steering YAML never closed": lambda: (steer / "open.md").write_text("---\ninclusion: manual\n"),
        "steering YAML alias bomb": lambda: (steer / "bomb.md").write_text("---\na: &a [*a]\n---\n"),
        "steering inclusion of a wrong type": lambda: (steer / "odd.md").write_text("---\ninclusion: [1]\n---\n"),
        "fileMatchPattern of a wrong type": lambda: (steer / "pat.md").write_text(
            "---\ninclusion: fileMatch\nfileMatchPattern: {a: 1}\n---\n"),
    }
    for make in tried.values():
        make()
    text = kirospec.context(spec / "tasks.md", "x", ["- _Requirements: 1.1_"]) or ""
    assert "requirements.md" not in text and "design.md" not in text and "fifo.md" not in text
    assert "Requirements this step cites: 1.1" in text
    assert ".kiro/steering/pat.md" not in text  # a fileMatch without a usable pattern matches nothing
    print(f"{len(tried)} bad spec files tried; the prompt section was made without waiting or failing")


def test_under_watch_a_review_point_goes_on_when_the_person_deletes_the_note(ws: Workspace) -> None:
    ws.task("---\nexecutor: shell\npause_at_checkpoints: true\n---\n"
            "- [ ] 1. Build\n  ```sh\n  echo 1 >> runs.log\n  ```\n"
            "- [ ] 2. Checkpoint - Ensure all tests pass\n  ```sh\n  echo 2 >> runs.log\n  ```\n"
            "- [ ] 3. Ship\n  ```sh\n  echo 3 >> runs.log\n  ```\n")
    proc = ws.spawn("loop", "watch")
    try:
        note = ws.wait_for(lambda: next((ws.root / "Needs_Action").glob("review_*.md"), None), what="review note")
        tid = note.stem[len("review_"):]
        ws.wait_for(lambda: ws.state(tid)["status"] == "paused", what="paused")
        assert ws.state(tid)["stop_reason"] == "checkpoint"
        assert (ws.root / "runs.log").read_text().split() == ["1", "2"]  # step 3 waits for the person
        note.unlink()  # seen at once: a deletion the supervisor missed would wait out its 30 s rescan
        ws.wait_for(lambda: (ws.root / "Done/feature/tasks.md").exists(), timeout=25, what="done after the review")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert (ws.root / "runs.log").read_text().split() == ["1", "2", "3"]
