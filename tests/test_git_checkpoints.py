"""Git checkpoints and rollback (SPEC §9) in real git repositories, through `kiro` as a subprocess."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from kiro.store import tasks
from tests.conftest import Workspace
from tests.gitutil import changed_in, files_in, fsck_problems, git, init_repo, trailers

TASK = """\
---
title: Greeter
executor: shell
---
# Plan
- [ ] 1. Write the greeting
  ```sh
  mkdir -p src && printf 'hello\\n' > src/greet.txt && printf '\\x00\\x01\\xff' > src/blob.bin
  ```
- [ ] 2. Check it (changes nothing)
  ```sh
  grep -q hello src/greet.txt
  ```
- [ ] 3. Extend it
  ```sh
  printf 'hello world\\n' > src/greet.txt && rm src/blob.bin && echo new > src/extra.txt
  ```
- [ ] 4. Document it
  ```sh
  echo "greets" >> README.md
  ```
"""


def _kiro_ok(ws: Workspace, *args: str) -> str:
    r = ws.kiro(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r.stdout


def _run(ws: Workspace, task_id: str = "g1", task: str = TASK) -> dict:  # type: ignore[type-arg]
    ws.task(task)
    _kiro_ok(ws, "loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", task_id)
    return ws.state(task_id)


def _boxes(path) -> dict[str, bool]:  # type: ignore[no-untyped-def]
    return {s.id: s.done for s in tasks.load(path).steps}


def test_one_commit_per_step_with_trailers_and_nothing_of_kiros_own(ws: Workspace) -> None:
    base = init_repo(ws.root)
    state = _run(ws)
    done = {c["step_id"]: c for c in state["completed_steps"]}
    assert list(done) == ["1", "2", "3", "4"]
    assert done["2"]["checkpoint"] is None and done["2"]["checkpoint_note"] == "no changes"
    kiro_commits = git(ws.root, "log", "--format=%H", f"{base}..HEAD").split()
    assert kiro_commits[::-1] == [done[s]["checkpoint"] for s in ("1", "3", "4")]  # one per changing step
    for sid in ("1", "3", "4"):
        sha = done[sid]["checkpoint"]
        subject = git(ws.root, "log", "-1", "--format=%s", sha).strip()
        assert subject.startswith(f"kiro(g1): {sid} ")
        t = trailers(ws.root, sha)
        assert t["Kiro-Task-Id"] == "g1" and t["Kiro-Step-Id"] == sid
        assert git(ws.root, "log", "-1", "--format=%an <%ae>", sha).strip() == "kiro <kiro@localhost>"
    assert changed_in(ws.root, done["1"]["checkpoint"]) == {"src/greet.txt", "src/blob.bin"}
    assert changed_in(ws.root, done["4"]["checkpoint"]) == {"README.md"}
    every = set().union(*(files_in(ws.root, c) for c in kiro_commits))
    assert not {f for f in every if f.split("/")[0] in (".state", "Logs", ".hooks", "Specs", "Done", ".kiro",
                                                         "Dashboard.md")}
    # the loop's work is committed: nothing of the project is left uncommitted
    status = git(ws.root, "status", "--porcelain", "--", ".", ":!.state", ":!Logs", ":!Done", ":!Specs",
                 ":!Dashboard.md", ":!Needs_Action", ":!.hooks", ":!config")
    assert status == ""
    events = [e["event"] for e in ws.events("g1")]
    assert events.count("checkpoint_created") == 3 and events.count("checkpoint_skipped") == 1
    # `progress --json` shows each step's checkpoint; the table shows it too
    progress = json.loads(_kiro_ok(ws, "loop", "progress", "--task-id", "g1", "--json"))
    assert {r["step_id"]: r["checkpoint"] for r in progress["steps"]} == {
        "1": done["1"]["checkpoint"], "2": "(no changes)", "3": done["3"]["checkpoint"], "4": done["4"]["checkpoint"]}
    table = _kiro_ok(ws, "loop", "progress", "--task-id", "g1")
    assert "checkpoint" in table and done["3"]["checkpoint"][:12] in table
    report = (ws.root / "Logs/completion_reports/g1.md").read_text()
    assert done["1"]["checkpoint"][:12] in report and "no changes" in report
    assert fsck_problems(ws.root) == []


def test_a_persons_commits_between_steps_are_kept_as_they_are(ws: Workspace) -> None:
    init_repo(ws.root)
    ws.task(TASK)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "g2", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    # a person commits on the same branch, and leaves a staged change of their own outside the project's changes
    (ws.root / "NOTES.md").write_text("my notes\n")
    git(ws.root, "add", "NOTES.md")
    git(ws.root, "commit", "-q", "-m", "person: notes")
    theirs = git(ws.root, "rev-parse", "HEAD").strip()
    _kiro_ok(ws, "loop", "resume", "--task-id", "g2", "--max-iterations", "10")
    state = ws.state("g2")
    first, *rest = [c["checkpoint"] for c in state["completed_steps"] if c["checkpoint"]]
    assert git(ws.root, "rev-parse", f"{theirs}^").strip() == first  # their commit sits on kiro's first one
    assert git(ws.root, "log", "-1", "--format=%an %s", theirs).strip() == "Pat Person person: notes"
    chain = git(ws.root, "rev-list", "--first-parent", "HEAD").split()
    assert theirs in chain and all(c in chain for c in rest)
    assert chain.index(theirs) > chain.index(rest[0])  # kiro's later commits come after theirs, on top


def test_checkpoints_off_outside_git_and_explicit_git_outside_a_repo_is_refused(ws: Workspace) -> None:
    state = _run(ws, "nogit")  # not a git work tree: checkpoints are off by default
    assert all(c["checkpoint"] is None for c in state["completed_steps"])
    assert state["git"]["checkpoints"] is False
    ws.task(TASK, "Specs/other/tasks.md")
    ws.write("config/autonomous_loop.yaml", "checkpoints: git\n")
    r = ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "g3")
    assert r.returncode == 1
    assert "checkpoints: git needs the project directory" in r.stderr and "Traceback" not in r.stderr
    ws.write("config/autonomous_loop.yaml", "checkpoints: svn\n")
    r = ws.kiro("loop", "start", "--task", "Specs/other/tasks.md", "--task-id", "g4")
    assert r.returncode == 1 and "checkpoints" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_checkpoints_off_makes_no_commit_in_a_repo(ws: Workspace) -> None:
    base = init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", "checkpoints: off\n")
    state = _run(ws, "off1")
    assert git(ws.root, "rev-parse", "HEAD").strip() == base
    assert all(c["checkpoint"] is None for c in state["completed_steps"])


def test_rollback_restores_bytes_and_boxes_then_resume_redoes_the_steps(ws: Workspace) -> None:
    init_repo(ws.root)
    state = _run(ws, "rb")
    cp1 = state["completed_steps"][0]["checkpoint"]
    greet_after_1 = git(ws.root, "show", f"{cp1}:src/greet.txt")
    head_before = git(ws.root, "rev-parse", "HEAD").strip()
    out = _kiro_ok(ws, "loop", "rollback", "--task-id", "rb", "--to-step", "2", "--json")
    result = json.loads(out)
    assert result["undone"] == ["3", "4"] and result["checkpoint"] == cp1  # step 2 changed nothing: step 1's commit
    # bytes: every project file as it was at the checkpoint, the binary one included, the later file gone
    assert (ws.root / "src/greet.txt").read_text() == greet_after_1 == "hello\n"
    assert (ws.root / "src/blob.bin").read_bytes() == b"\x00\x01\xff"
    assert not (ws.root / "src/extra.txt").exists()
    assert (ws.root / "README.md").read_text() == "# project\n"
    assert git(ws.root, "rev-parse", f"{result['commit']}^").strip() == head_before  # a new commit, nothing rewritten
    assert trailers(ws.root, "HEAD")["Kiro-Rollback-To"] == "2"
    assert files_in(ws.root, "HEAD") == files_in(ws.root, cp1)
    # boxes: the task went back from Done/ to Specs/ with 3 and 4 unchecked, 1 and 2 still done
    task_file = ws.root / "Specs/feature/tasks.md"
    assert _boxes(task_file) == {"1": True, "2": True, "3": False, "4": False}
    st = ws.state("rb")
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2"]
    assert st["git"]["rollbacks"][-1]["to_step"] == "2" and st["status"] == "stopped"
    assert [e for e in ws.events("rb") if e["event"] == "rolled_back"][0]["undone"] == ["3", "4"]
    # resume does 3 and 4 again, with new checkpoints on top of the rollback
    _kiro_ok(ws, "loop", "resume", "--task-id", "rb")
    st = ws.state("rb")
    assert [c["step_id"] for c in st["completed_steps"]] == ["1", "2", "3", "4"]
    assert (ws.root / "src/greet.txt").read_text() == "hello world\n"
    assert git(ws.root, "rev-parse", f"{st['completed_steps'][2]['checkpoint']}^").strip() == result["commit"]
    assert fsck_problems(ws.root) == []


def test_rollback_keeps_a_persons_later_commit(ws: Workspace) -> None:
    init_repo(ws.root)
    ws.task(TASK)
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "rp", "--max-iterations", "2")
    assert r.returncode == 4
    (ws.root / "NOTES.md").write_text("mine\n")
    git(ws.root, "add", "NOTES.md")
    git(ws.root, "commit", "-q", "-m", "person: notes")
    _kiro_ok(ws, "loop", "resume", "--task-id", "rp", "--max-iterations", "10")
    result = json.loads(_kiro_ok(ws, "loop", "rollback", "--task-id", "rp", "--to-step", "1", "--json"))
    assert result["method"] == "revert"
    assert (ws.root / "NOTES.md").read_text() == "mine\n"  # the person's change stays
    assert (ws.root / "src/greet.txt").read_text() == "hello\n" and not (ws.root / "src/extra.txt").exists()
    assert (ws.root / "README.md").read_text() == "# project\n"
    assert "person: notes" in git(ws.root, "log", "--format=%s")


def test_rollback_refusals_leave_everything_as_it_was(ws: Workspace) -> None:
    init_repo(ws.root)
    state = _run(ws, "rr")
    state_file = ws.root / ".state/archive/autonomous_loop_rr.json"
    before = state_file.read_bytes()
    head = git(ws.root, "rev-parse", "HEAD").strip()
    tried = 0
    held = 0

    def refused(*args: str, says: str) -> None:
        nonlocal tried, held
        tried += 1
        r = ws.run("loop", "rollback", "--task-id", "rr", *args)
        ok = (r.returncode == 1 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1
              and "Traceback" not in r.stderr and state_file.read_bytes() == before
              and git(ws.root, "rev-parse", "HEAD").strip() == head)
        held += ok
        print(f"rollback {' '.join(args)!r}: exit {r.returncode}: {r.stderr.strip()}")
        assert ok, r.stdout + r.stderr

    (ws.root / "src/greet.txt").write_text("a person's edit\n")
    refused("--to-step", "1", says="holds changes kiro did not make in the files the rollback changes (src/greet.txt)")
    git(ws.root, "checkout", "--", "src/greet.txt")
    (ws.root / "src/blob.bin").write_text("untracked, where the rollback would put step 1's file back\n")
    refused("--to-step", "1", says="src/blob.bin")
    (ws.root / "src/blob.bin").unlink()
    refused("--to-step", "9", says="not among the steps loop 'rr' completed (1, 2, 3, 4)")
    refused("--to-step", "4", says="is the last step")
    assert state["completed_steps"][-1]["step_id"] == "4"
    print(f"rollback refusals: {held} of {tried} held")


def test_rollback_is_refused_while_the_loop_runs(ws: Workspace) -> None:
    init_repo(ws.root)
    ws.task(TASK.replace("echo \"greets\" >> README.md", "echo greets >> README.md; sleep 30"))
    proc = ws.spawn("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "live")
    try:
        ws.wait_for(lambda: (ws.state("live")["current_step"] or {}).get("step_id") == "4", what="step 4 running")
        # the state names step 4 as its shell starts: its first command has written README.md only some time later
        ws.wait_for(lambda: "greets" in (ws.root / "README.md").read_text(), what="step 4's change to README.md")
        r = ws.run("loop", "rollback", "--task-id", "live", "--to-step", "1")
        assert r.returncode == 1 and "is running" in r.stderr and "kiro loop stop" in r.stderr, r.stderr
        assert (ws.root / "src/extra.txt").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    # stopped now: the half-done step 4 left README.md changed, which kiro did not commit; the rollback changes
    # only the files of this loop's commits after step 1, and leaves that change as it is
    r = ws.run("loop", "rollback", "--task-id", "live", "--to-step", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (ws.root / "src/extra.txt").exists() and "greets" in (ws.root / "README.md").read_text()


def test_a_rollback_torn_by_a_kill_is_finished_by_running_it_again(ws: Workspace) -> None:
    """A kill while git moved the files leaves some of them as the rollback has them, the index and
    HEAD not: running the rollback again finishes it instead of refusing those files as a person's."""
    init_repo(ws.root)
    _run(ws, "tr")
    (ws.root / "src/greet.txt").write_text("hello\n")  # already back to step 1's bytes; the rest not yet
    r = ws.run("loop", "rollback", "--task-id", "tr", "--to-step", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (ws.root / "src/blob.bin").read_bytes() == b"\x00\x01\xff" and not (ws.root / "src/extra.txt").exists()
    assert (ws.root / "src/greet.txt").read_text() == "hello\n"
    assert [e["files"] for e in ws.events("tr") if e["event"] == "rollback_resumed"] == [["src/greet.txt"]]
    assert git(ws.root, "status", "--porcelain", "--untracked-files=no") == ""


def test_files_the_person_ignores_globally_stay_out_of_checkpoints(ws: Workspace, tmp_path: Path) -> None:
    """kiro runs git without the global config, but keeps the person's global ignore file."""
    init_repo(ws.root)
    home = tmp_path / "home"
    home.mkdir()
    (home / ".gitconfig").write_text("[core]\n\texcludesFile = ~/my-ignores\n[user]\n\tname = Not Kiro\n")
    (home / "my-ignores").write_text("*.secret\n")
    ws.task("---\ntitle: t\nexecutor: shell\n---\n- [ ] 1. Write\n  ```sh\n"
            "  echo k > api.secret; echo ok > a.txt\n  ```\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ig", env=ws.env(HOME=str(home)))
    assert r.returncode == 0, r.stdout + r.stderr
    cp = ws.state("ig")["completed_steps"][0]["checkpoint"]
    assert changed_in(ws.root, cp) == {"a.txt"}
    assert git(ws.root, "log", "-1", "--format=%an", cp).strip() == "kiro"  # the global user.name is not used


def test_a_gitignore_that_lists_kiros_folders_still_gets_checkpoints(ws: Workspace) -> None:
    """Many projects ignore .state/ and Logs/; git then names them as ignored paths and exits 1 on
    `git add -A` with kiro's excludes, although it staged the work: every step still gets its commit."""
    init_repo(ws.root)
    (ws.root / ".gitignore").write_text(".state/\nLogs/\nDashboard.md\n")
    git(ws.root, "add", ".gitignore")
    git(ws.root, "commit", "-q", "-m", "ignore kiro's files")
    state = _run(ws, "gi")
    done = {c["step_id"]: c for c in state["completed_steps"]}
    assert [done[s]["checkpoint_note"] for s in ("1", "3", "4")] == [None, None, None], done
    assert all(done[s]["checkpoint"] for s in ("1", "3", "4"))
    assert changed_in(ws.root, done["1"]["checkpoint"]) == {"src/greet.txt", "src/blob.bin"}
    assert "checkpoint_failed" not in [e["event"] for e in ws.events("gi")]


IGNORE_ALL = """\
---
title: t
executor: shell
---
- [ ] 1. Ignore everything, change a tracked file
  ```sh
  printf '*\\n' > .gitignore && echo edited >> README.md && echo new > new.txt
  ```
- [ ] 2. Change it again
  ```sh
  echo again >> README.md
  ```
"""


def test_an_agents_gitignore_of_everything_still_gets_checkpoints_and_a_rollback(ws: Workspace) -> None:
    """An agent writes a `.gitignore` of `*`: git then names kiro's `config` folder (whose one file kiro
    leaves out) among the ignored paths, and `git add -A` exits 1 although it staged the tracked file's
    change; kiro took that for a failed checkpoint, left the change staged, and rollback refused it as
    a change kiro did not make. Each step gets its checkpoint of what git still tracks."""
    init_repo(ws.root)
    state = _run(ws, "ia", IGNORE_ALL)
    done = {c["step_id"]: c for c in state["completed_steps"]}
    notes = {s: done[s]["checkpoint_note"] for s in done}
    print(f"checkpoints: {[(s, bool(done[s]['checkpoint']), notes[s]) for s in done]}")
    assert notes == {"1": None, "2": None}, notes
    assert changed_in(ws.root, done["1"]["checkpoint"]) == {"README.md"}
    assert "checkpoint_failed" not in [e["event"] for e in ws.events("ia")]
    assert git(ws.root, "status", "--porcelain", "--untracked-files=no") == ""
    _kiro_ok(ws, "loop", "rollback", "--task-id", "ia", "--to-step", "1")
    assert (ws.root / "README.md").read_text() == "# project\nedited\n"


def test_the_repositorys_hooks_do_not_run_for_kiros_commits(ws: Workspace) -> None:
    init_repo(ws.root)
    marker = ws.root.parent / "hook-ran"
    for name in ("pre-commit", "commit-msg", "post-commit"):
        hook = ws.root / ".git/hooks" / name
        hook.write_text(f"#!/bin/sh\necho {name} >> {marker}\nexit 1\n")
        hook.chmod(0o755)
    state = _run(ws, "hk")
    assert all(c["checkpoint"] for c in state["completed_steps"] if c["step_id"] != "2")
    assert not marker.exists()
    # the person's own commits still run them (this pre-commit hook refuses every commit)
    (ws.root / "x.txt").write_text("x\n")
    git(ws.root, "add", "x.txt")
    git(ws.root, "commit", "-qm", "person", check=False)
    assert marker.read_text().split() == ["pre-commit"]


def test_a_project_with_no_git_folder_above_it_runs_no_git(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """git finds a work tree only by a `.git` on the way up (kiro's git runs without GIT_DIR): where
    there is none, kiro does not spawn git to hear "none" at every start. A project reached through a
    symlink into a work tree is still seen in it (git starts from the physical folder)."""
    import os
    import shutil

    from kiro.git import gitcli

    real_git = shutil.which("git")
    assert real_git is not None
    calls = tmp_path / "git-calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    wrapper = bin_dir / "git"
    wrapper.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real_git} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    plain = tmp_path / "plain" / "project"
    plain.mkdir(parents=True)
    if any((p / ".git").exists() for p in (plain, *plain.parents)):
        pytest.skip("the temp folder is inside a git work tree")
    assert gitcli.toplevel(plain) is None
    assert not calls.exists(), calls.read_text()

    repo = tmp_path / "repo"
    (repo / "sub").mkdir(parents=True)
    git(repo, "init", "-q")
    link = tmp_path / "plain" / "link"
    link.symlink_to(repo / "sub")
    assert gitcli.toplevel(link) == repo.resolve()
    assert "rev-parse --show-toplevel" in calls.read_text()


def test_a_secret_in_a_steps_title_or_text_reaches_no_commit_and_the_commit_is_still_found(ws: Workspace) -> None:
    """Commit messages pass through the run's redactor: a known secret in a step's title, or in the
    text of a step with no number (its text is its id, written in the Kiro-Step-Id trailer), is cut;
    the look for a step's commit after a kill compares the id as written."""
    from kiro.core.features import attach
    from kiro.store.config import Config
    from kiro.store.redact import Redactor
    from kiro.store.state import LoopState
    from kiro.store.workspace import Workspace as KiroWorkspace

    secret = "tok-" + "9" * 24
    init_repo(ws.root)
    ws.task(f"---\ntitle: Keyed\nexecutor: shell\n---\n- [ ] 1. Use {secret} for the greeting\n  ```sh\n"
            f"  echo hi > a.txt\n  ```\n- [ ] Deploy with {secret}\n  ```sh\n  echo there > b.txt\n  ```\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "k1",
                env=ws.env(ACME_DEPLOY_TOKEN=secret))
    assert r.returncode == 0, r.stdout + r.stderr
    messages = git(ws.root, "log", "--format=%B", "--grep=Kiro-Task-Id: k1")
    assert messages.count("Kiro-Task-Id: k1") == 2 and secret not in messages, messages
    assert "kiro(k1): 1 Use [REDACTED] for the greeting" in messages
    state = LoopState.model_validate(ws.state("k1"))
    assert [c.step_id for c in state.completed_steps] == ["1", "Deploy with [REDACTED]"]  # the state is cut too
    lg = attach(KiroWorkspace(ws.root), Config(), state, ws.root)
    assert lg is not None
    lg.redact = Redactor([secret]).text  # as Engine._open_git sets it
    for step_id, c in zip(["1", f"Deploy with {secret}"], state.completed_steps, strict=True):
        assert c.checkpoint and c.iteration is not None  # what a resume after a kill between commit and save looks for
        assert lg.find(step_id, c.iteration) == c.checkpoint, step_id


def test_kiros_git_runs_no_program_a_step_wrote_into_the_repository(ws: Workspace, tmp_path: Path) -> None:
    """A step (or an agent CLI) can write .git/config, .gitattributes and .git/hooks: kiro's own git
    (the checkpoint's add, diff and commit) must run none of the programs named there (issue #27 item 2)."""
    init_repo(ws.root)
    # sandbox: off: the step's box refuses the writes into .git/ (tests/test_sandbox.py), not .gitattributes in
    # the project; without the box (sandbox: off, or no bwrap) kiro's git must hold against all of them
    ws.write("config/autonomous_loop.yaml", "sandbox: off\n")
    ran = tmp_path / "ran"
    ran.mkdir()
    planted = {
        "filter clean": f"git config filter.x.clean 'touch {ran}/clean; cat'",
        "filter process": f"git config filter.y.process 'touch {ran}/process' && git config filter.y.required true",
        "diff textconv": f"git config diff.d.textconv 'touch {ran}/textconv; cat'",
        "diff command": f"git config diff.d.command 'touch {ran}/command'",
        "post-index-change hook": (f"printf '#!/bin/sh\\ntouch {ran}/hook\\n' > .git/hooks/post-index-change && "
                                   "chmod +x .git/hooks/post-index-change"),
    }
    task = ("---\ntitle: Hostile\nexecutor: shell\n---\n- [ ] 1. Plant\n  ```sh\n  "
            + " && ".join(planted.values())
            + " && printf '*.txt filter=x diff=d\\n*.md filter=y\\n' > .gitattributes"
              " && echo hi > a.txt && echo hi > b.md\n  ```\n"
            + "- [ ] 2. Change them\n  ```sh\n  echo more >> a.txt && echo more >> b.md\n  ```\n")
    state = _run(ws, "hostile", task)
    assert [c["step_id"] for c in state["completed_steps"]] == ["1", "2"]
    fired = sorted(p.name for p in ran.iterdir())
    held = [name for name in planted if name.split()[-1] not in fired]
    print(f"programs planted in the repository for kiro's git: {len(planted)} tried, {len(held)} held; ran: {fired}")
    assert fired == []
    assert {"a.txt", "b.md"} <= files_in(ws.root, state["completed_steps"][1]["checkpoint"])
