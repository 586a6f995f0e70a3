"""`isolation: worktree` (SPEC §9): each loop in its own git worktree and branch; parallel loops under
`kiro loop watch`; `merge: manual | auto`; a merge conflict pauses the loop (exit 6)."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

from tests.conftest import FAST_CONFIG, Workspace
from tests.gitutil import files_in, fsck_problems, git, init_repo

WORKTREE = FAST_CONFIG + "isolation: worktree\n"


def _task(cmd1: str, cmd2: str, verify: str | None = None) -> str:
    extra = f"verify: {verify}\n" if verify else ""
    return (f"---\ntitle: Isolated\nexecutor: shell\n{extra}---\n# Plan\n"
            f"- [ ] 1. First\n  ```sh\n  {cmd1}\n  ```\n- [ ] 2. Second\n  ```sh\n  {cmd2}\n  ```\n")


def test_three_loops_under_watch_run_in_parallel_each_in_its_own_worktree(ws: Workspace) -> None:
    base = init_repo(ws.root)
    spans = ws.root.parent / "spans.log"
    spans.touch()  # beside the workspace: the config grants the steps' box this one file (sandbox_paths.rw)
    ws.write("config/autonomous_loop.yaml", WORKTREE + f"sandbox_paths:\n  rw: [{json.dumps(str(spans))}]\n")
    step = ('echo "start $(date +%s.%N) $KIRO_TASK_ID" >> "$KIRO_WORKSPACE/../spans.log"; sleep 1.5; '
            'echo "$KIRO_TASK_ID wrote this in step $KIRO_STEP_ID" > shared.txt; '
            'echo "end $(date +%s.%N) $KIRO_TASK_ID" >> "$KIRO_WORKSPACE/../spans.log"')
    names = ("alpha", "beta", "gamma")
    for name in names:
        ws.task(_task(step, step), f"Specs/{name}/tasks.md")
    proc = ws.spawn("loop", "watch", "--max-parallel", "3")
    try:
        ws.wait_for(lambda: all((ws.root / f"Done/{n}/tasks.md").exists() for n in names), timeout=120,
                    what="three loops done")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    archive = ws.root / ".state/archive"
    ids = sorted(p.name[len("autonomous_loop_"):-5] for p in archive.glob("autonomous_loop_*.json"))
    assert len(ids) == 3
    for tid in ids:
        st = ws.state(tid)
        assert st["status"] == "completed"
        assert st["git"]["branch"] == f"kiro/{tid}" and st["git"]["merge_status"] == "left"
        tree = ws.root / ".kiro/worktrees" / tid
        assert Path(st["git"]["worktree"]) == tree.resolve()
        # each loop's file is its own, on its own branch, in its own worktree: no collisions
        assert git(ws.root, "show", f"kiro/{tid}:shared.txt") == f"{tid} wrote this in step 2\n"
        assert (tree / "shared.txt").read_text() == f"{tid} wrote this in step 2\n"
        assert git(ws.root, "rev-list", "--count", f"{base}..kiro/{tid}").strip() == "2"
        assert git(ws.root, "merge-base", f"kiro/{tid}", "main").strip() == base
        report = (ws.root / f"Logs/completion_reports/{tid}.md").read_text()
        assert f"`kiro/{tid}` left for review" in report
    # the person's branch is untouched, and the main tree has no shared.txt
    assert git(ws.root, "rev-parse", "main").strip() == base
    assert not (ws.root / "shared.txt").exists()
    assert set(git(ws.root, "branch", "--format=%(refname:short)").split()) == {"main", *(f"kiro/{t}" for t in ids)}
    # truly in parallel: at some instant all three loops were inside a step
    events = []
    for line in spans.read_text().splitlines():
        kind, ts, tid = line.split()
        events.append((float(ts), 1 if kind == "start" else -1))
    running = peak = 0
    for _, delta in sorted(events):
        running += delta
        peak = max(peak, running)
    assert peak == 3, spans.read_text()
    assert fsck_problems(ws.root) == []


def test_auto_merge_brings_the_branch_back_and_the_agent_and_verify_ran_in_the_worktree(ws: Workspace) -> None:
    base = init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", WORKTREE + "merge: auto\n")
    ws.task(_task("pwd > where.txt; echo one > one.txt", "echo two > two.txt", verify="test -f one.txt"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "am")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("am")
    assert st["git"]["merge_status"] == "merged"
    head = git(ws.root, "rev-parse", "HEAD").strip()
    assert st["git"]["merge_commit"] == head
    parents = git(ws.root, "log", "-1", "--format=%P", head).split()
    assert parents == [base, git(ws.root, "rev-parse", "kiro/am").strip()]  # a merge commit; the branch stays
    assert (ws.root / "one.txt").read_text() == "one\n" and (ws.root / "two.txt").read_text() == "two\n"
    # the step ran in the loop's worktree (verify `test -f one.txt` passed there, before any merge)
    assert (ws.root / "where.txt").read_text().strip().endswith(".kiro/worktrees/am")
    assert not (ws.root / ".kiro/worktrees/am").exists()  # merged: its worktree is removed
    assert "merged into `main`" in (ws.root / "Logs/completion_reports/am.md").read_text()
    assert [e["event"] for e in ws.events("am")].count("merge_completed") == 1
    assert git(ws.root, "status", "--porcelain", "--untracked-files=no") == ""


def test_a_merge_conflict_pauses_with_exit_6_naming_branch_and_file_and_resume_finishes(ws: Workspace) -> None:
    init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", WORKTREE + "merge: auto\n")
    ws.task(_task("echo kiro-one > shared.txt", "echo kiro-two >> shared.txt"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "mc", "--max-iterations", "1")
    assert r.returncode == 4, r.stdout + r.stderr
    # meanwhile a person commits the same file on main
    (ws.root / "shared.txt").write_text("the person's version\n")
    git(ws.root, "add", "shared.txt")
    git(ws.root, "commit", "-q", "-m", "person: shared.txt")
    r = ws.kiro("loop", "resume", "--task-id", "mc", "--max-iterations", "10")
    assert r.returncode == 6, r.stdout + r.stderr
    st = ws.state("mc")
    assert st["status"] == "paused" and st["stop_reason"] == "merge_conflict"
    assert st["git"]["conflict_files"] == ["shared.txt"]
    request = (ws.root / "Needs_Action/intervention_mc.md").read_text()
    assert "kiro/mc" in request and "shared.txt" in request and "reason: merge_conflict" in request
    assert "<<<<<<<" in (ws.root / "shared.txt").read_text()  # left for the person to resolve
    # still unresolved: resume pauses again
    assert ws.kiro("loop", "resume", "--task-id", "mc").returncode == 6
    # the person resolves and commits; resume finishes the loop
    (ws.root / "shared.txt").write_text("both, resolved\n")
    git(ws.root, "add", "shared.txt")
    git(ws.root, "commit", "-q", "--no-edit")
    r = ws.kiro("loop", "resume", "--task-id", "mc")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("mc")
    assert st["status"] == "completed" and st["git"]["merge_status"] == "merged"
    assert git(ws.root, "merge-base", "--is-ancestor", "kiro/mc", "main", check=False) == ""
    assert (ws.root / "shared.txt").read_text() == "both, resolved\n"
    assert fsck_problems(ws.root) == []


def test_worktree_isolation_outside_git_is_refused_in_one_line(ws: Workspace) -> None:
    ws.write("config/autonomous_loop.yaml", WORKTREE)
    ws.task(_task("true", "true"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "nogit")
    assert r.returncode == 1 and "isolation: worktree needs the project directory" in r.stderr, r.stderr
    ws.write("config/autonomous_loop.yaml", WORKTREE + "checkpoints: off\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "nogit2")
    assert r.returncode == 1 and "needs checkpoints: git" in r.stderr, r.stderr


def test_a_merge_torn_by_a_kill_mid_checkout_is_finished_and_a_persons_edit_is_not_taken(tmp_path: Path) -> None:
    """The state a kill leaves when git was moving the main tree to the merge: some files already as
    the merge has them, index and HEAD not. `finish()` puts those back and merges; a file a person
    changed differently stops the merge, named."""
    from kiro.git.checkpoints import LoopGit
    from kiro.store.state import GitInfo
    from kiro.store.workspace import Workspace as KiroWorkspace

    root = tmp_path / "repo"
    root.mkdir()
    init_repo(root)
    for name, text in (("a.txt", "a0\n"), ("c.txt", "c0\n"), ("d.txt", "d0\n")):
        (root / name).write_text(text)
    git(root, "add", ".")
    git(root, "commit", "-qm", "files")
    git(root, "checkout", "-qb", "kiro/t")
    (root / "a.txt").write_text("a1\n")
    (root / "b.txt").write_text("b1\n")
    (root / "c.txt").unlink()
    (root / "d.txt").write_text("d1\n")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "kiro's work")
    git(root, "checkout", "-q", "main")
    # torn: a.txt and b.txt written, c.txt removed; d.txt not reached yet
    (root / "a.txt").write_text("a1\n")
    (root / "b.txt").write_text("b1\n")
    (root / "c.txt").unlink()
    info = GitInfo(checkpoints=True, isolation="worktree", merge="auto", toplevel=str(root), branch="kiro/t",
                   base_branch="main")
    lg = LoopGit(KiroWorkspace(root), info, "t", root, root)
    lg._paths()
    res = lg.finish()
    assert res.problem is None and info.merge_status == "merged"
    resumed = [e.to_record() for e in res.events if e.event == "merge_resumed"]
    assert [(r["branch"], r["files"]) for r in resumed] == [("kiro/t", ["a.txt", "b.txt", "c.txt"])]
    assert {p: (root / p).read_text() for p in ("a.txt", "b.txt", "d.txt")} == {"a.txt": "a1\n", "b.txt": "b1\n",
                                                                                "d.txt": "d1\n"}
    assert not (root / "c.txt").exists() and git(root, "status", "--porcelain") == ""
    # a person's own edit to a file the next merge changes is not overwritten: the merge stops, naming it
    git(root, "checkout", "-qb", "kiro/u", "kiro/t")
    (root / "d.txt").write_text("d2\n")
    git(root, "commit", "-qam", "more kiro work")
    git(root, "checkout", "-q", "main")
    (root / "d.txt").write_text("the person's d\n")
    info2 = GitInfo(checkpoints=True, isolation="worktree", merge="auto", toplevel=str(root), branch="kiro/u",
                    base_branch="main")
    lg2 = LoopGit(KiroWorkspace(root), info2, "u", root, root)
    lg2._paths()
    res2 = lg2.finish()
    assert res2.problem is not None and "d.txt" in res2.problem
    assert (root / "d.txt").read_text() == "the person's d\n"


def test_rollback_of_an_isolated_loop_works_in_its_worktree_and_leaves_main_alone(ws: Workspace) -> None:
    base = init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", WORKTREE)
    ws.task(_task("echo one > notes.txt", "echo two >> notes.txt"))
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "wr")
    assert r.returncode == 0, r.stdout + r.stderr
    tree = ws.root / ".kiro/worktrees/wr"
    assert (tree / "notes.txt").read_text() == "one\ntwo\n"
    r = ws.run("loop", "rollback", "--task-id", "wr", "--to-step", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tree / "notes.txt").read_text() == "one\n"
    assert git(ws.root, "show", "kiro/wr:notes.txt") == "one\n"
    assert git(ws.root, "log", "-1", "--format=%s", "kiro/wr").strip() == "kiro(wr): rollback to 1"
    assert git(ws.root, "rev-parse", "main").strip() == base and not (ws.root / "notes.txt").exists()
    r = ws.kiro("loop", "resume", "--task-id", "wr")
    assert r.returncode == 0, r.stdout + r.stderr
    assert git(ws.root, "show", "kiro/wr:notes.txt") == "one\ntwo\n"
    assert ws.state("wr")["git"]["merge_status"] == "left"


def test_an_agent_in_a_worktree_is_given_the_workspaces_task_file_and_checks_its_box_there(ws: Workspace,
                                                                                       tmp_path: Path) -> None:
    """The command executor's agent works in the worktree but checks its box in the workspace's task file
    kiro reads, through its own copy of it in the workspace's .state/steps/ (kiro.executors.control.StepCopy):
    the prompt names the copy by its absolute path (a relative one would point into the worktree)."""
    init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", WORKTREE + "executor: command\n")
    agent = tmp_path / "agent.sh"
    agent.write_text(
        "#!/bin/bash\n"
        "prompt=$(cat)\n"
        "file=$(printf '%s' \"$prompt\" | grep -o 'check its box in the task file `[^`]*`' | head -1 | cut -d'`' -f2)\n"
        "pwd > where.txt\n"
        "echo \"$file\" > told.txt\n"
        "sed -i \"s/^- \\[-\\] $KIRO_STEP_ID\\./- [x] $KIRO_STEP_ID./\" \"$file\"\n")
    agent.chmod(0o755)
    ws.write("config/autonomous_loop.yaml", WORKTREE + f"executor: command\nexecutor_command: {agent}\n")
    ws.task("---\ntitle: agent\n---\n- [ ] 1. Do the thing\n")
    r = ws.kiro("loop", "start", "--task", "Specs/feature/tasks.md", "--task-id", "ag")
    assert r.returncode == 0, r.stdout + r.stderr
    told = Path(git(ws.root, "show", "kiro/ag:told.txt").strip())
    assert told.is_absolute() and told.name == "tasks.md", told
    assert told.parent.parent == (ws.root / ".state" / "steps").resolve(), told  # the workspace's, not the worktree's
    assert git(ws.root, "show", "kiro/ag:where.txt").strip().endswith(".kiro/worktrees/ag")
    assert "- [x] 1. Do the thing" in (ws.root / "Done/feature/tasks.md").read_text()


def _kill_worktree_add_mid_checkout(root: Path, tid: str) -> Path:
    """Run the `git worktree add` kiro runs for loop `tid` and SIGKILL it part-way through its
    checkout: the work tree git leaves (HEAD readable, files missing, marked 'initializing')."""
    import subprocess
    import time

    from tests.gitutil import git_env

    wt = root / ".kiro/worktrees" / tid
    wt.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(20):
        proc = subprocess.Popen(["git", "worktree", "add", "-q", "-b", f"kiro/{tid}", str(wt), "HEAD"], cwd=root,
                                env=git_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            if (wt / "d").is_dir() and len(os.listdir(wt / "d")) >= 20:
                break
            time.sleep(0.0005)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        admin = root / ".git/worktrees" / tid
        missing = 3000 - len(os.listdir(wt / "d")) if (wt / "d").is_dir() else 3000
        if (admin / "locked").exists() and missing > 0 and git(wt, "rev-parse", "HEAD", check=False).strip():
            return wt
        import shutil  # the add finished (or had not begun its checkout) before the kill: again

        shutil.rmtree(wt, ignore_errors=True)
        git(root, "worktree", "prune")
        git(root, "branch", "-q", "-D", f"kiro/{tid}", check=False)
    raise AssertionError("could not stop `git worktree add` part-way through its checkout in 20 tries")


def test_a_worktree_whose_git_worktree_add_was_killed_mid_checkout_is_made_again_not_committed_as_deletions(
        ws: Workspace) -> None:
    """A kill during `git worktree add` leaves a work tree with HEAD set and its checkout part-done.
    Committing a step there recorded the missing files as deleted, and `merge: auto` deleted them from
    main (the auto-merge kill test's 'files are not in the main tree'). kiro makes such a worktree again."""
    init_repo(ws.root)
    for i in range(3000):
        ws.write(f"d/{i}.txt", f"file {i}\n")
    git(ws.root, "add", "d")
    git(ws.root, "commit", "-qm", "3,000 files")
    ws.write("config/autonomous_loop.yaml", WORKTREE + "merge: auto\n")
    ws.task(_task("echo one > one.txt", "echo two > two.txt"), "Specs/torn/tasks.md")
    wt = _kill_worktree_add_mid_checkout(ws.root, "torn")
    r = ws.kiro("loop", "start", "--task", "Specs/torn/tasks.md", "--task-id", "torn")
    assert r.returncode == 0, r.stdout + r.stderr
    st = ws.state("torn")
    assert st["status"] == "completed" and st["git"]["merge_status"] == "merged"
    # nothing deleted: not on the loop's branch, not in main's tree or on disk
    head_files = files_in(ws.root, "HEAD")
    assert {f"d/{i}.txt" for i in range(3000)} <= head_files and {"one.txt", "two.txt"} <= head_files
    assert len(os.listdir(ws.root / "d")) == 3000
    assert not wt.exists() and fsck_problems(ws.root) == []
    assert git(ws.root, "worktree", "list", "--porcelain").count("worktree ") == 1
    events = [json.loads(ln)["event"] for ln in (ws.root / "Logs/torn.jsonl").read_text().splitlines()]
    assert "worktree_recreated" in events


def test_a_worktree_a_person_locked_is_not_taken_for_a_torn_one(ws: Workspace) -> None:
    """Only git's own 'initializing' mark means a half-made worktree; a person's `git worktree lock`
    leaves the worktree (and the lock) as they are."""
    from kiro.git.checkpoints import LoopGit
    from kiro.store.state import GitInfo
    from kiro.store.workspace import Workspace as KiroWorkspace

    init_repo(ws.root)
    wt = ws.root / ".kiro/worktrees/kept"
    git(ws.root, "worktree", "add", "-q", "-b", "kiro/kept", str(wt), "HEAD")
    git(ws.root, "worktree", "lock", "--reason", "reviewing this one", str(wt))
    (wt / "notes.txt").write_text("a person's notes\n")
    lg = LoopGit(KiroWorkspace(ws.root), GitInfo(checkpoints=True, isolation="worktree", merge="manual"), "kept",
                 ws.root, ws.root)
    events = lg.open(resumed=False)
    assert [e for e, _ in events] == []
    assert (wt / "notes.txt").read_text() == "a person's notes\n"
    assert (ws.root / ".git/worktrees/kept/locked").read_text().strip() == "reviewing this one"


def test_a_git_worktree_add_killed_before_its_checkout_began_does_not_block_the_loop(ws: Workspace) -> None:
    """Killed earlier, `git worktree add` leaves only its record (.git/worktrees/<id> with `gitdir` and
    `locked: initializing`, no HEAD), no folder, and perhaps the new branch's ref lock; a later add is
    refused ("missing but locked worktree", "remove the file manually"), which stopped the loop with
    exit 1 until a person ran `git worktree unlock` or removed the lock."""
    init_repo(ws.root)
    ws.write("config/autonomous_loop.yaml", WORKTREE + "merge: auto\n")
    ws.task(_task("echo one > one.txt", "echo two > two.txt"), "Specs/early/tasks.md")
    admin = ws.root / ".git/worktrees/early"
    admin.mkdir(parents=True)
    (admin / "locked").write_text("initializing\n")  # what git writes first, in this order
    (admin / "gitdir").write_text(f"{ws.root / '.kiro/worktrees/early/.git'}\n")
    (ws.root / ".git/refs/heads/kiro").mkdir(parents=True)
    (ws.root / ".git/refs/heads/kiro/early.lock").write_text("")  # `-b kiro/early` was making the branch
    r = ws.kiro("loop", "start", "--task", "Specs/early/tasks.md", "--task-id", "early")
    assert r.returncode == 0, r.stdout + r.stderr
    assert ws.state("early")["git"]["merge_status"] == "merged"
    assert {"one.txt", "two.txt"} <= files_in(ws.root, "HEAD")
    assert not admin.exists() and fsck_problems(ws.root) == []
