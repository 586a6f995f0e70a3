"""Two loops in one work tree under `kiro loop watch` (issue #38 item 2): each loop's checkpoints hold what
its own steps changed, never the other loop's files, nor a person's uncommitted or untracked files; a
rollback of one loop then goes through, keeping the other's work. Real git, real `kiro loop watch`, two
Kiro spec folders with shell steps.

The loops are made to overlap: loop alpha's step 2 waits (inside its attempt) until loop beta has run all
its steps. Files changed while both loops' attempts ran cannot be told apart (a file carries no writer):
those are left out of both loops' checkpoints, and the event names the other loop.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.conftest import Workspace, shell_task
from tests.gitutil import git, init_repo, trailers

ALPHA = """\
---
executor: shell
---
# Plan
- [ ] 1. First
  ```sh
  echo a1 > alpha1.txt
  ```
- [ ] 2. Second, once beta is done
  ```sh
  touch .markers/alpha-in-2; while [ ! -e .markers/go ]; do sleep 0.05; done; echo a2 > alpha2.txt
  ```
- [ ] 3. Third
  ```sh
  echo a3 > alpha3.txt
  ```
"""


def _loops(root: Path) -> dict[str, dict]:  # type: ignore[type-arg]
    from kiro.store import journal

    out = {}
    for p in (root / ".state").rglob("autonomous_loop_*.json"):
        if "backups" in p.parts:
            continue
        st = journal.read_state_dict(p)
        out[st["task_path"].split("/")[-2]] = st
    return out


def test_two_loops_in_one_work_tree_commit_only_their_own_files(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    init_repo(root)
    (root / ".gitignore").write_text(".markers/\n")
    (root / ".kiro/specs/alpha").mkdir(parents=True)
    (root / ".kiro/specs/alpha/tasks.md").write_text(ALPHA)
    git(root, "add", ".")
    git(root, "commit", "-qm", "the alpha spec")
    (root / ".markers").mkdir()
    # the person's work, not committed: an edit and a new file
    (root / "README.md").write_text("# project\nthe person's edit, not committed\n")
    (root / "notes.txt").write_text("the person's own notes\n")
    (root / "Approved").mkdir()  # where the person approves a held task file (below)
    ws = Workspace(root)
    proc = ws.spawn("loop", "watch", "--max-parallel", "4")
    try:
        ws.wait_for(lambda: (root / ".markers/alpha-in-2").exists(), timeout=120, what="alpha in step 2")
        # the person writes a new spec (never committed): the watch starts it beside alpha
        (root / ".kiro/specs/beta").mkdir()
        beta = shell_task(2, cmd='echo "b$KIRO_STEP_ID" > "beta$KIRO_STEP_ID.txt"')
        (root / ".kiro/specs/beta/tasks.md").write_text(beta)
        # a task file that appears while a step runs waits for a person's approval (SPEC §15): the person gives it
        note = ws.wait_for(lambda: next((root / "Pending_Approval").glob("task_file_*.md"), None), timeout=120,
                           what="beta held for approval")
        note.rename(root / "Approved" / note.name)
        ws.wait_for(lambda: _loops(root).get("beta", {}).get("status") == "completed", timeout=120, what="beta done")
        (root / ".markers/go").touch()
        ws.wait_for(lambda: _loops(root).get("alpha", {}).get("status") == "completed", timeout=120,
                    what="alpha done")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    loops = _loops(root)
    ids = {name: st["task_id"] for name, st in loops.items()}
    allowed = {ids["alpha"]: {"alpha1.txt", "alpha2.txt", "alpha3.txt", ".kiro/specs/alpha/tasks.md"},
               ids["beta"]: {"beta1.txt", "beta2.txt"}}  # beta's task file is the person's: never committed
    commits = git(root, "log", "--format=%H", "HEAD").split()
    print("\ncommits, newest first:")
    by_loop: dict[str, list[set[str]]] = {}
    for sha in commits:
        files = set(git(root, "show", "--format=", "--name-only", sha).split())
        owner = trailers(root, sha).get("Kiro-Task-Id", "(a person)")
        print(f"  {sha[:10]} {owner:12} {sorted(files)}")
        if owner in allowed:
            by_loop.setdefault(owner, []).append(files)
            assert files <= allowed[owner], f"{owner}'s commit {sha[:10]} holds {sorted(files - allowed[owner])}"
    every = set().union(*(f for fs in by_loop.values() for f in fs))
    assert "notes.txt" not in every and "README.md" not in every and ".kiro/specs/beta/tasks.md" not in every
    # alpha's steps 1 and 3 ran while no other loop's attempt did: their files are in alpha's commits
    assert {"alpha1.txt", "alpha3.txt"} <= every, by_loop
    # what both loops' attempts may have written is left out, and the event names the other loop
    events = [json.loads(line) for p in (root / "Logs").glob("*.jsonl") for line in p.read_text().splitlines()]
    left = [e for e in events if e.get("event") == "checkpoint_left_out"]
    for e in left:
        print(f"  left out by {e['task_id']} at step {e['step_id']}: {e['files']} ({e['reason']})")
    assert any(e["task_id"] == ids["beta"] and "beta1.txt" in e["files"] and ids["alpha"] in e["reason"]
               for e in left), left
    # the person's files are as they were, uncommitted
    assert "the person's edit" in (root / "README.md").read_text()
    status = git(root, "status", "--porcelain")
    assert " M README.md" in status and "?? notes.txt" in status, status
    # rolling alpha back to step 1 undoes alpha's later work and nothing of beta's nor the person's
    r = ws.kiro("loop", "rollback", "--task-id", ids["alpha"], "--to-step", "1", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (root / "alpha3.txt").exists() and (root / "alpha1.txt").exists()
    assert (root / "beta1.txt").exists() and (root / "notes.txt").exists()
